"""Verdicts, round two (docs/speed-of-light.md, docs/correctness.md), on the CPU: the floor is the
bytes a correct kernel must move (an algebraic shortcut is counted and labelled), verify's memory
plan (a pure function of sizes and free memory), measures and comparisons by chunks across
devices, a weak reference told from a random one by running it twice, eval_only with its
evidence, and speed of light where the user reads it (bench text and JSON, hover, lens tooltip,
report). GPU halves: test_gpu_edges.py (four 6 GiB benches) and test_gpu_accuracy.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp import verdicts  # noqa: E402
from kernel_lsp.engine.worker.judge import accuracy, memory_plan  # noqa: E402
from kernel_lsp.engine.worker.timing import roofline  # noqa: E402
from kernel_lsp.engine.worker.judge.verify import compare_tensor  # noqa: E402
from kernel_lsp.model import Evaluation, Timing  # noqa: E402

from .test_accuracy import _inline, evaluate_file  # noqa: E402

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]


# -- the floor ------------------------------------------------------------------------------------

H200 = roofline.for_device("NVIDIA H200", "torch.float32")


def test_only_the_bytes_floor_is_impossible_and_the_reference_flops_make_a_shortcut() -> None:
    # diag(A) @ B at KernelBench level 1 problem 12's size (N = M = 4096): the reference's matmul is
    # 2 N^2 M = 1.37e11 FLOP, 0.278 ms at the H200's TF32 peak; a row scale moves N + 2 N M floats.
    n = m = 4096
    nbytes = 4 * (n + 2 * n * m)
    ref_flops = 2 * n * n * m
    bytes_ms = H200.bytes_ms(nbytes)
    assert bytes_ms == pytest.approx(0.02797, rel=1e-3)
    measured = 0.0335  # a row scale at about 4 TB/s: 8x below the reference's FLOP floor
    assert roofline.check(measured, nbytes, ref_flops, H200) is None            # not beyond the roofline
    cut = roofline.shortcut(measured, ref_flops, H200)
    assert cut is not None and cut["reference_flop_floor_ms"] == pytest.approx(0.2778, rel=1e-3)
    # Below the bytes floor by more than the margin: impossible, whatever the FLOPs.
    assert roofline.check(0.6 * bytes_ms, nbytes, ref_flops, H200) is not None
    assert roofline.check(0.75 * bytes_ms, nbytes, ref_flops, H200) is None     # within MARGIN (0.7)
    # Outputs that fit in L2 may still sit there when the end event fires: not part of the floor.
    l2 = 60 << 20
    small_out = roofline.check(0.6 * H200.bytes_ms(2 * (32 << 20)), 2 * (32 << 20), None, H200,
                               l2_bytes=l2, written=32 << 20)
    assert small_out is None


def test_speed_of_light_keys_label_and_launch_overhead() -> None:
    sol = roofline.speed_of_light(0.28, 128 << 20, None, H200, "NVIDIA H200")
    assert set(sol) >= {"bytes_floor_ms", "flop_floor_ms", "fraction", "bandwidth", "bandwidth_source", "label"}
    assert sol["flop_floor_ms"] is None and sol["bandwidth"] == 4.8e12 and sol["bandwidth_source"] == "table"
    assert sol["fraction"] == pytest.approx(0.02796 / 0.28, rel=1e-3)
    assert sol["label"] == "10.0 % of the H200's memory floor (28 us to move its bytes once)"
    # Its own FLOPs known (a PyTorch rewrite) and binding: the compute floor.
    sol = roofline.speed_of_light(1.0, 1 << 20, int(2.5e11), H200, "NVIDIA H200")
    assert "compute floor" in sol["label"] and sol["flop_floor_ms"] == pytest.approx(0.505, rel=1e-2)
    tiny = roofline.speed_of_light(0.008, 4096, None, H200, "NVIDIA H200")
    assert tiny["launch_overhead_sized"] and "launch-overhead-sized" in tiny["label"]


def _timed(sol: dict, custom: bool = True, flags: list[str] | None = None) -> Evaluation:
    t = Timing(median_ms=0.4762, min_ms=0.47, max_ms=0.48, spread_pct=0.5, runs=20)
    return Evaluation(task="t", candidate="c", verdict="correct", correct=True, message="matches the reference "
                      "on 5 input sets", time=t, eager=Timing(0.5, 0.5, 0.5, 1.0, 20), custom_kernel=custom,
                      flags=flags or [], evidence={"speed_of_light": sol}, device={"name": "NVIDIA H200"})


def test_far_from_the_hardware_on_the_recorded_h200_cases() -> None:
    """benchmarks/results/speed_of_light.json: bias_gelu's default kernel (8.8 %) is far; the tuned
    elementwise kernels (35-42 %) are not; the .cu matmul (0.3 %) is compute-bound with unknown
    FLOPs: no hint."""
    rows = {r["target"]: r for r in json.loads((ROOT / "benchmarks/results/speed_of_light.json").read_text())["rows"]}

    def sol_of(name: str) -> dict:
        r = rows[name]
        return roofline.speed_of_light(r["median_ms"], r["bytes"], None, H200, "NVIDIA H200", r["flops"])

    far = verdicts.far_from_hardware(_timed(sol_of("bias_gelu")))
    assert far is not None and far.startswith("far from the hardware: 8.8 % of the H200's memory floor")
    assert verdicts.far_from_hardware(_timed(sol_of("relu"))) is None
    assert verdicts.far_from_hardware(_timed(sol_of("matmul"))) is None
    assert verdicts.far_from_hardware(_timed(sol_of("bias_gelu"), custom=False)) is None  # not a kernel
    at_floor = roofline.speed_of_light(0.027, 128 << 20, None, H200, "NVIDIA H200")
    assert at_floor["fraction"] == 1.0 and verdicts.far_from_hardware(_timed(at_floor)) is None
    small = roofline.speed_of_light(0.2, 4096, None, H200, "NVIDIA H200")
    assert small["fraction"] < 0.01 and verdicts.far_from_hardware(_timed(small)) is None  # says so instead
    assert "launch-overhead-sized" in small["label"]


# -- memory ------------------------------------------------------------------------------------------

def test_memory_plan_keeps_a_small_task_on_the_gpu() -> None:
    p = memory_plan.plan(64 << 20, 64 << 20, 0, 0, free_bytes=130 * GIB, host_free_bytes=100 * GIB)
    assert (p.keep, p.oracle, p.sets, p.notes) == ("device", "device", 3, [])


def test_memory_plan_for_the_6_gib_softmax_on_an_empty_h200() -> None:
    six = 6 * GIB
    p = memory_plan.plan(six, six, 0, 0, free_bytes=139 * GIB, host_free_bytes=120 * GIB)
    assert p.sets == 2 and "2 fresh input sets checked instead of 3" in p.notes[0]
    assert p.keep == "host" and p.oracle == "device"   # 36 GiB of sets > 25 % of the 109 GiB spare
    assert p.working_bytes == 30 * GIB and p.oracle_bytes == 30 * GIB
    # Another process holds most of the GPU: the float64 run goes to the host CPU.
    p = memory_plan.plan(six, six, 0, 0, free_bytes=50 * GIB, host_free_bytes=120 * GIB)
    assert (p.keep, p.oracle) == ("host", "host") and "on the host CPU" in p.notes[-1]
    # Nowhere has room: no oracle, said why (the fixed tolerance decides).
    p = memory_plan.plan(six, six, 0, 0, free_bytes=50 * GIB, host_free_bytes=10 * GIB)
    assert p.oracle == "none" and "no float64 reference" in p.notes[-1]
    # What verify needs at once never exceeds one set's working set: a Task whose reference and
    # candidate fit once is judged.
    assert p.working_bytes < 50 * GIB


def test_the_oracle_is_sized_against_what_is_alive_when_it_runs() -> None:
    # The 6 GiB softmax on an 80 GB H100 (78.9 GiB free; the reference's workspace 6 GiB): its
    # float64 run (45 GiB) does not fit beside the whole working set (42 GiB), but runs while only
    # the inputs, their copy and the two outputs are alive (24 GiB): on the GPU, not the CPU.
    six = 6 * GIB
    p = memory_plan.plan(six, six, 0, six, free_bytes=int(78.9 * GIB), host_free_bytes=120 * GIB)
    assert p.oracle_bytes == 45 * GIB and p.working_bytes == 42 * GIB
    assert (p.keep, p.oracle) == ("host", "device"), p.notes
    # Less room than that: the host CPU, and the note says how much the GPU had beside the check.
    p = memory_plan.plan(six, six, 0, six, free_bytes=60 * GIB, host_free_bytes=120 * GIB)
    assert p.oracle == "host" and "36.0 GiB free beside the check itself" in p.notes[-1], p.notes


def test_the_warm_up_sets_memory_counts_as_free_when_the_sets_are_not_kept_on_the_gpu() -> None:
    # Recorded on an H100 80GB (tests/engine/test_gpu_verdicts_round2.py, 2026-12-05): the 6 GiB
    # softmax's plan read 71,363,133,440 bytes free while the warm-up set's input and expected
    # output (12 GiB) were alive, and sent the float64 run to the host CPU ("42.5 GiB free beside
    # the check"), although verify frees those 12 GiB before the sets.
    six, free = 6 * GIB, 71_363_133_440
    p = memory_plan.plan(six, six, 0, six, free_bytes=free, host_free_bytes=130_867_302_400)
    assert p.oracle_bytes == 48_318_382_080  # the run's own evidence.memory.oracle_bytes
    assert (p.keep, p.oracle) == ("host", "host") and "42.5 GiB free beside the check itself" in p.notes[-1]
    p = memory_plan.plan(six, six, 0, six, free_bytes=free, host_free_bytes=130_867_302_400, held_bytes=2 * six)
    assert (p.keep, p.oracle) == ("host", "device"), p.notes
    # A Task whose float64 run fits only with the warm-up set counted as free goes to the device.
    edge = memory_plan.plan(six, six, 0, six, free_bytes=58 * GIB, host_free_bytes=None, held_bytes=12 * GIB)
    assert edge.oracle == "device" and edge.oracle_bytes + 24 * GIB <= 70 * GIB
    assert memory_plan.plan(six, six, 0, six, free_bytes=58 * GIB, host_free_bytes=None).oracle == "host"


def test_an_oracle_out_of_gpu_memory_runs_on_the_host_cpu_instead(monkeypatch) -> None:
    # The plan leaves room, the allocator finds less (its rounding, another process): the float64
    # run moves to the host CPU and the verdict is the oracle's, with a note; never "no float64".
    # No GPU here: the oracle is sent to the meta device, where this reference runs out of memory.
    from kernel_lsp.engine.worker.judge import oracle

    real_run = oracle.Oracle._run

    def first_on_meta(self, *args, **kw):
        if not getattr(self, "sent_to_meta", False):
            self.sent_to_meta, self.device = True, torch.device("meta")
        return real_run(self, *args, **kw)

    monkeypatch.setattr(oracle.Oracle, "_run", first_on_meta)
    ev = _inline(OOM_OFF_CPU)
    assert ev.verdict == "correct", ev.message
    assert ev.accuracy["rule"] == "oracle" and ev.accuracy["oracle"]["device"] == "cpu", ev.accuracy
    assert "did not fit on meta beside the check: it ran on the host CPU" in " ".join(ev.evidence.get("notes", [])), (ev.evidence, ev.message)


OOM_OFF_CPU = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        if x.device.type != "cpu":  # as a float64 run too large for the GPU would
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 45.00 GiB")
        return torch.softmax(x, dim=1)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(8, 64)]


def get_init_inputs():
    return []
"""


def test_memory_plan_scales_the_oracle_by_the_dtype() -> None:
    fp16 = memory_plan.oracle_bytes(GIB, GIB, 0, 0, element_bytes=2)
    fp32 = memory_plan.oracle_bytes(GIB, GIB, 0, 0, element_bytes=4)
    assert fp16 == 2 * fp32


def test_measure_and_compare_by_chunks_across_devices_equal_the_whole(monkeypatch) -> None:
    torch.manual_seed(0)
    o64 = torch.randn(300, 70, dtype=torch.float64)
    ref = (o64 + 1e-6 * torch.randn_like(o64)).float()
    out = ref.clone()
    out[123 // 70, 123 % 70] += 0.5
    whole = accuracy.measure(out, ref, o64)
    monkeypatch.setattr(accuracy, "CHUNK", 1000)
    chunked = accuracy.measure(out, ref, o64)
    for f in ("cand_err", "ref_err", "ratio", "where", "outcome", "beyond", "scale", "loose_ok"):
        assert getattr(chunked, f) == pytest.approx(getattr(whole, f)), f
    ev = compare_tensor(out, ref, None, None)
    assert ev is not None and ev["where"] == [1, 53] and ev["mismatched"] == 1
    out[250, 3] = float("nan")
    ev = compare_tensor(out, ref, None, None)
    assert ev["nonfinite"] and ev["where"] == [250, 3] and ev["nonfinite_mask"].shape == out.shape


# -- the engine on the suite --------------------------------------------------------------------------

def test_an_algebraic_shortcut_is_counted_and_labelled() -> None:
    ev = evaluate_file("diag_rowscale")
    assert ev.verdict == "correct" and "algebraic_shortcut" in ev.flags, ev.message
    assert "not_counted" not in ev.flags and "beyond_roofline" not in ev.flags
    assert "does less arithmetic than the reference: an algebraic shortcut, checked on 5 fresh input sets" \
        in ev.message
    assert verdicts.shortcut_phrase(ev) == ("does less arithmetic than the reference: an algebraic shortcut, "
                                            "checked on 5 fresh input sets")
    assert verdicts.shortcut_phrase(ev.summary()) == verdicts.shortcut_phrase(ev)


def test_a_weak_reference_is_judged_against_float64() -> None:
    ev = evaluate_file("variance_weak_reference")
    assert ev.verdict == "correct" and "weak_reference" in ev.flags, ev.message
    weak = ev.accuracy["weak_reference"]
    assert 0.1 < weak["ref_err"] < 0.6 and ev.accuracy["rule"] == "oracle"
    assert "the reference itself is 0.2" in ev.message and "of scale off float64 on output: numerically weak; " \
        "judged against float64" in ev.message
    assert ev.accuracy["oracle"]["reruns"] == 1       # the float64 run once more, under another seed
    assert "numerically weak" in verdicts.accuracy_phrase(ev.accuracy)
    old = evaluate_file("variance_weak_reference", oracle=False)
    assert old.verdict == "mismatch"                  # the reference's rounding is no yardstick
    # A candidate as weak as the reference (its own rounding) is still correct.
    from .test_accuracy import _load

    ns = _load("variance_weak_reference")
    assert ns["EXPECTED"] == "correct"


RANDOM_REF = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)   # random: no run reproduces another


class ModelNew(nn.Module):
    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

WEAK_TWICE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return (x * x).mean(dim=-1) - x.mean(dim=-1) ** 2


class ModelNew(nn.Module):
    def forward(self, x):
        return (x * x).mean(dim=-1) - x.mean(dim=-1) ** 2 + 0.05 * x.mean(dim=-1).abs().clamp(max=1)


def get_inputs():
    return [torch.randn(64, 4096) + 1000.0]


def get_init_inputs():
    return []
'''


def test_a_random_reference_keeps_the_fixed_tolerance_and_says_why() -> None:
    ev = _inline(RANDOM_REF)
    assert ev.accuracy["rule"] == "fixed_tolerance", ev.accuracy
    notes = " ".join(ev.evidence["notes"])
    assert "the reference is random: two fp32 runs on the same input differ" in notes, notes
    assert "weak_reference" not in ev.flags


def test_a_wrong_candidate_of_a_weak_reference_is_still_refused() -> None:
    ev = _inline(WEAK_TWICE)
    assert ev.verdict == "mismatch", ev.message
    assert "the reference is numerically weak" in ev.message and "judged against float64" in ev.message


def test_eval_only_says_where_training_mode_differs() -> None:
    ev = evaluate_file("bn_train_dropped")
    assert "eval_only" in ev.flags
    assert "; in training mode output[" in ev.message and "PyTorch's error against float64" in ev.message
    text = verdicts.train_difference(ev.accuracy)
    assert text is not None and text.startswith("output[") and "float64" in text
    assert ev.accuracy["train_evidence"]["ratio"] > 1e4


# -- where the user reads it -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def far_ev() -> Evaluation:
    sol = roofline.speed_of_light(0.4762, 192 << 20, None, H200, "NVIDIA H200")
    return _timed(sol, flags=["algebraic_shortcut"])


def test_bench_text_and_json_show_speed_of_light(far_ev) -> None:
    from kernel_lsp.cli import bench

    doc = bench._summary(far_ev, {"name": "NVIDIA H200"}, True)
    assert doc["speed_of_light"]["fraction"] == pytest.approx(0.0419 / 0.4762, rel=1e-2)
    assert doc["evidence"]["speed_of_light"]["label"].startswith("8.8 % of the H200's memory floor")
    out = io.StringIO()
    bench._bench_table([far_ev], {"name": "NVIDIA H200"}, ["bias_gelu.py"], [True], out)
    text = out.getvalue()
    assert "speed of light: 8.8 % of the H200's memory floor (41.9 us to move its bytes once)" in text
    assert "hint: far from the hardware" in text


def test_hover_lens_tooltip_and_report_show_speed_of_light(far_ev) -> None:
    from kernel_lsp.agent.report import _evaluation
    from kernel_lsp.server.evaluation import lens_tooltip, measurement_markdown
    from kernel_lsp.server.state import Measurement

    m = Measurement(evaluation=far_ev, version=1, text="x")
    hover = "\n".join(measurement_markdown(m, "x"))
    assert "Speed of light: 8.8 % of the H200's memory floor" in hover
    assert "speed of light: 8.8 %" in lens_tooltip(m)

    class View:
        root_id, root_first = "root", None

        def speedup(self, cand):
            return None, None

    row = _evaluation(far_ev.to_dict(), View(), "c", None)
    assert "speed of light" in row and "8.8 % of the H200" in row


def test_a_host_kept_expected_output_checks_the_device_the_outputs_belong_on() -> None:
    from kernel_lsp.engine.worker.judge.verify import _Fail, check_structure

    expected_on_host = torch.zeros(4)
    check_structure(torch.ones(4), expected_on_host, 0)   # both on the CPU: a CPU Task
    with pytest.raises(_Fail, match="is on cpu, expected cuda"):
        check_structure(torch.ones(4), expected_on_host, 0, device=torch.device("cuda"))


def test_the_hover_says_weak_reference_and_the_training_mode_difference() -> None:
    from kernel_lsp.cli import bench
    from kernel_lsp.server.evaluation import measurement_markdown
    from kernel_lsp.server.state import Measurement

    weak = evaluate_file("variance_weak_reference")
    hover = "\n".join(measurement_markdown(Measurement(evaluation=weak, version=1, text="x"), "x"))
    assert "of scale off float64 on output: numerically weak; judged against float64" in hover, hover
    assert bench._summary(weak, {"name": "cpu"}, False)["accuracy"]["weak_reference"]["ref_err"] > 0.1
    dropped = evaluate_file("bn_train_dropped")
    hover = "\n".join(measurement_markdown(Measurement(evaluation=dropped, version=1, text="x"), "x"))
    assert "Training mode: output[" in hover and "PyTorch's error against float64" in hover, hover
    out = io.StringIO()
    bench._bench_table([dropped], {"name": "cpu"}, ["bn_train_dropped.py"], [False], out)
    assert "training mode: output[" in out.getvalue()
