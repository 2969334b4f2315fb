"""Where verify keeps its own data, so that the engine's bookkeeping never runs a Task out of
memory: a pure function of sizes and free memory (standard library only; tests/engine/
test_verdicts_round2.py and test_turn_need.py check it without a GPU).

Verify needs, at one time on the GPU, one input set, the candidate's output and workspace, the
reference's output and workspace (`working`). Beyond that it keeps, per fresh input set, the
inputs and the expected outputs (`per_set`), and runs the reference once more in float64 (the
oracle: inputs, parameters, outputs and workspace at 8 bytes an element). Each goes on the GPU
while it fits beside the working set with a margin, else on the host:

* kept sets and expected outputs: on the GPU when all of them take at most KEEP_SHARE of what
  is free beyond the working set; else in host memory (copied back one set at a time), which
  verify turns into "recompute" (kept nowhere: drawn and computed again, worker/judge/recompute.py)
  when the draw and the reference repeat;
* the float64 oracle: on the GPU when it fits beside what is alive while it runs (a set's inputs
  and their copy, the two outputs, the kept sets; ORACLE_HEADROOM for the allocator's rounding);
  else on the host (CPU, float64);
  when the host cannot hold it either, there is no oracle and the fixed tolerance decides;
* input sets: `wanted`, but FEWER_SETS when one set (inputs + outputs) is above LARGE_SET_BYTES,
  with a note (each set of a 6 GiB softmax costs seconds to make, move and check).

A Task whose reference and candidate each fit once on the GPU is judged: nothing here needs
more GPU memory than the working set.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
# The kept sets may take this share of the GPU memory free beyond the working set. Accepts
# 3 sets of a 64 MiB Task on any GPU; a 6 GiB softmax's 3 x 12 GiB = 36 GiB is kept on the host
# of an H200 running nothing else (141 GB - working set 30 GiB = ~100 GiB free x 0.25 = 25 GiB).
KEEP_SHARE = 0.25
# The float64 run needs this much more than its tensors' bytes (allocator rounding, temporaries).
ORACLE_HEADROOM = 1.25
# Above this many bytes per input set (inputs + outputs), FEWER_SETS fresh sets are checked.
LARGE_SET_BYTES = 2 * GIB
FEWER_SETS = 2
# The plan's note when the sets go to host memory (verify replaces it when it recomputes them).
HOST_NOTE = "input sets and expected outputs kept in host memory"


@dataclass
class Plan:
    keep: str            # "device" | "host" | "recompute" (set by verify): where sets and outputs are kept
    oracle: str          # "device" | "host" | "none": where the float64 reference runs
    sets: int            # fresh input sets to check
    notes: list[str]
    working_bytes: int   # what verify needs on the GPU at one time
    oracle_bytes: int    # the float64 run's estimate


def oracle_bytes(input_bytes: int, output_bytes: int, param_bytes: int, peak_bytes: int,
                 element_bytes: int = 4) -> int:
    """The float64 run's estimate: inputs, parameters, outputs and the reference's own workspace
    scaled from `element_bytes` to 8 bytes an element."""
    scale = 8 / max(1, min(8, element_bytes))
    return int(ORACLE_HEADROOM * scale * (input_bytes + output_bytes + param_bytes + max(0, peak_bytes)))


def set_count(per_set: int, wanted: int = 3) -> int:
    """Fresh input sets to check: `wanted` (at least 2), FEWER_SETS above LARGE_SET_BYTES a set."""
    return min(max(2, wanted), FEWER_SETS) if per_set > LARGE_SET_BYTES else max(2, wanted)


def working_bytes(input_bytes: int, output_bytes: int, peak_bytes: int) -> int:
    """One set's inputs (twice: the candidate's and a pristine copy, and the reference's), both
    outputs and both workspaces: what verify needs on the GPU at one time."""
    return 3 * input_bytes + 2 * output_bytes + 2 * max(0, peak_bytes)


def plan(input_bytes: int, output_bytes: int, param_bytes: int, peak_bytes: int, free_bytes: int | None,
         host_free_bytes: int | None, wanted: int = 3, element_bytes: int = 4, on_gpu: bool = True,
         held_bytes: int = 0) -> Plan:
    """`peak_bytes`: the reference's own workspace beyond its inputs (its measured peak);
    `free_bytes`: GPU memory free to this process (None: a CPU Task, everything on the host);
    `held_bytes`: what is on the GPU as the plan is made and freed before the sets when they are
    not kept there (the warm-up set's inputs and expected output)."""
    notes: list[str] = []
    per_set = input_bytes + output_bytes
    sets = set_count(per_set, wanted)
    if sets < max(2, wanted):
        notes.append(f"{per_set / GIB:.1f} GiB per input set (inputs and outputs): {sets} fresh input sets "
                     f"checked instead of {max(2, wanted)} (above {LARGE_SET_BYTES / GIB:.0f} GiB a set)")
    need64 = oracle_bytes(input_bytes, output_bytes, param_bytes, peak_bytes, element_bytes)
    working = working_bytes(input_bytes, output_bytes, peak_bytes)
    if not on_gpu or free_bytes is None:
        host_ok = host_free_bytes is None or need64 <= host_free_bytes
        return Plan("device", "host" if host_ok else "none", sets,
                    notes + ([] if host_ok else [_no_room(need64, host_free_bytes)]), working, need64)
    spare = max(0, free_bytes - working)
    keep = "device" if (sets + 1) * per_set <= KEEP_SHARE * spare else "host"
    if keep == "host":
        notes.append(f"{HOST_NOTE} ({(sets + 1) * per_set / GIB:.1f} GiB; "
                     f"{free_bytes / GIB:.1f} GiB of GPU memory free)")
    kept_on_gpu = (sets + 1) * per_set if keep == "device" else 0
    # The oracle runs inside a set's check, when its inputs (the candidate's and a pristine copy),
    # the candidate's output and the expected one are alive (and, with the sets kept on the GPU,
    # the previous set's expected output), not the references' workspaces: on an 80 GB H100 the
    # 6 GiB softmax's float64 run (45 GiB) fits beside those 24 GiB, not beside the whole working
    # set (42 GiB). Where the allocator still finds too little, the oracle moves to the host CPU
    # (worker/judge/oracle.py).
    # `free_bytes` is read while the warm-up set's inputs and expected output are alive; with the
    # sets not kept on the GPU verify frees them first, and `alive` counts their successors: on
    # the H100 the 6 GiB softmax's plan read 66.5 GiB free with those 12 GiB still held.
    alive = 2 * input_bytes + (3 if keep == "device" else 2) * output_bytes
    room = max(0, free_bytes + (held_bytes if keep != "device" else 0) - alive - kept_on_gpu)
    if need64 <= room:
        oracle = "device"
    elif host_free_bytes is None or need64 <= host_free_bytes:
        oracle = "host"
        notes.append(f"the float64 reference runs on the host CPU (about {need64 / GIB:.1f} GiB; the GPU has "
                     f"{room / GIB:.1f} GiB free beside the check itself)")
    else:
        oracle = "none"
        notes.append(_no_room(need64, host_free_bytes))
    return Plan(keep, oracle, sets, notes, working, need64)


# What a Worker's evaluation holds on the GPU beyond its Task's tensors: the CUDA context, cuBLAS's
# workspace, the timing's L2 flush buffer, torch.compile's own allocations.
CONTEXT_BYTES = GIB


def turn_need(input_bytes: int, output_bytes: int, param_bytes: int, wanted: int = 3) -> int:
    """What an evaluation of a Task with these sizes (one input set, its outputs, the Model's
    parameters) needs on the GPU to be judged with nothing moved to the host: the working set,
    the kept sets and the float64 oracle as `plan` counts them, the reference's workspace taken as
    large as its largest tensor (unknown before it runs), twice the parameters (the reference's
    Model and the candidate's), and CONTEXT_BYTES. Said by a process waiting for the GPU, so that
    a holder with much live data may still let it in (caller/gpu_lock.may_hand_over)."""
    peak = max(input_bytes, output_bytes)
    per_set = input_bytes + output_bytes
    return int(working_bytes(input_bytes, output_bytes, peak) + (set_count(per_set, wanted) + 1) * per_set
               + oracle_bytes(input_bytes, output_bytes, param_bytes, peak) + 2 * param_bytes + CONTEXT_BYTES)


def recompute_note(sets: int, per_set: int) -> str:
    """What verify says when it keeps the sets nowhere (worker/judge/recompute.py decides)."""
    return (f"input sets and expected outputs not kept ({(sets + 1) * per_set / GIB:.1f} GiB would not fit beside "
            "the check on the GPU): each set drawn again from its seed and the reference run again when needed "
            "(both checked repeatable on the warm-up set), instead of copies to host memory")


def _no_room(need: int, host_free: int | None) -> str:
    return (f"no float64 reference: it needs about {need / GIB:.1f} GiB, more than the GPU or the host "
            f"({(host_free or 0) / GIB:.1f} GiB free) can give")
