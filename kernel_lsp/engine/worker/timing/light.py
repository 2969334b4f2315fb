"""Speed of light for a measured time: how far it is from the hardware, whether it is below what
any correct kernel can do (`beyond_roofline`, not counted), and whether it is below what the
reference's own arithmetic allows (`algebraic_shortcut`, counted and labelled).

The floor (docs/speed-of-light.md): the bytes any correct implementation must move, i.e. the
inputs and parameters the reference reads (once each) and its outputs (written once), at the
device's bandwidth (roofline.py's table, else a measured copy). Evaluation.evidence
["speed_of_light"] carries it for every front end (its keys: roofline.speed_of_light).
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_lsp.engine.worker.timing import bench, roofline
from kernel_lsp.engine.worker.harness import Harness, clone_inputs, flat_tensors
from kernel_lsp.model import Evaluation


def reference_traffic(h: Harness) -> tuple[int, int, int | None]:
    """(bytes read, bytes written, FLOPs) of one reference call, for a time with no verify
    before it (a reference timed alone)."""
    from torch.utils.flop_counter import FlopCounterMode

    from kernel_lsp.engine.worker.judge.verify import OpRecorder, read_bytes, written_bytes

    assert h.model is not None
    s = h.make_inputs(h.seed)
    rec = OpRecorder(reads=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter, rec:
        out = h.model(*clone_inputs(s.values))
    tensors = flat_tensors(s.values) + list(h.model.parameters()) + list(h.model.buffers())
    return read_bytes(rec.reads or {}, tensors), written_bytes(out, tensors), int(counter.get_total_flops()) or None


def assess(h: Harness, ev: Evaluation, extra: dict[str, Any], notes: list[str], dtype: str,
           candidate_too: bool, read: int, written: int, ref_flops: int | None,
           own_flops: int | None, sets_checked: int = 0) -> None:
    """Put speed_of_light in `extra` for the time shown (the candidate's, else eager's); flag a
    candidate below the bytes floor (beyond_roofline) or below the reference's FLOP floor
    (algebraic_shortcut; `sets_checked`: the input sets verify checked it on, for the message)."""
    dev = h.device
    timed = ev.time if candidate_too else ev.eager
    if dev.type != "cuda" or timed is None:
        return
    name = str((ev.device or {}).get("name", ""))
    roof = roofline.for_device(name, dtype)
    if roof.bandwidth is None:
        roof = roofline.for_device(name, dtype, bench.measured_copy_bandwidth(dev))
    l2 = int((ev.device or {}).get("l2_bytes") or 0)
    nbytes = read + written
    if not candidate_too:
        own_flops = ref_flops  # the reference timed alone: its own arithmetic is known
    small = "launch_overhead_sized" in ev.flags
    sol = roofline.speed_of_light(timed.median_ms, nbytes, own_flops, roof, name, ref_flops, small)
    if sol is not None:
        extra["speed_of_light"] = sol
    if not candidate_too:
        return
    beyond = roofline.check(timed.median_ms, nbytes, ref_flops, roof, l2_bytes=l2, written=written)
    if beyond is not None:
        ev.flags.append("beyond_roofline")
        extra["roofline"] = beyond
        notes.append(f"{timed.median_ms:.4g} ms is below the time to move the bytes any correct kernel must "
                     f"move ({beyond['floor_ms']:.4g} ms for {beyond['bytes']} bytes at "
                     f"{(roof.bandwidth or 0) / 1e12:.2f} TB/s): a measurement error or a cheat, not a gain")
        return
    cut = roofline.shortcut(timed.median_ms, ref_flops, roof)
    if cut is not None:
        extra["shortcut"] = cut
        if "algebraic_shortcut" not in ev.flags:
            from kernel_lsp.verdicts import shortcut_words

            ev.flags.append("algebraic_shortcut")
            ev.message += "; " + shortcut_words(sets_checked)
        notes.append(f"{timed.median_ms:.4g} ms is below the {cut['reference_flop_floor_ms']:.4g} ms the reference's "
                     f"{ref_flops:.3g} FLOPs take at peak: the candidate does less arithmetic than the reference")
