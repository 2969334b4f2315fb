"""Out of memory on a shared GPU is "could not run" (exit 2), never a verdict against the
candidate: it names the processes holding the memory, waits (bounded) for it to free and
runs once more (issue 20, item 6). CPU: a real evaluation whose candidate raises torch's
out-of-memory error (its message as CUDA writes it), beside a fake holder (a fake process
list); tests/engine/test_gpu_edges.py does it with a real one on a GPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.cli.bench import status  # noqa: E402
from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker.timing import bench, gpu_share  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Candidate, Task  # noqa: E402
from kernel_lsp.verdicts import GPU_MEMORY_HELD, evaluation_reason  # noqa: E402

CHEATS = Path(__file__).parent / "cheats"
GIB = 1 << 30
OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
       "1.25 GiB is free. Including non-PyTorch memory, this process has 3.10 GiB memory in use.")


def candidate(marker: Path, message: str = OOM) -> Candidate:
    # Runs out of memory while `marker` exists (the fake holder holds the GPU), then works.
    src = (CHEATS / "correct.py").read_text().replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        f"        import os\n        if os.path.exists({str(marker)!r}):\n"
        f"            raise torch.OutOfMemoryError({message!r})\n")
    return Candidate(source=src, kind="python")


def task() -> Task:
    path = CHEATS / "ref_linear.py"
    return Task(name="ref_linear", reference_path=str(path), reference_source=path.read_text())


class Holder:
    """A fake process list: pid 4242 holds `gib` until release() (then it is gone)."""

    def __init__(self, gib: float, marker: Path, release_after: int | None = None) -> None:
        self.gib, self.marker, self.release_after, self.asked = gib, marker, release_after, 0
        marker.write_text("held")

    def processes(self, device: Any, own_pid: int | None = None) -> tuple[str, list[dict[str, Any]]]:
        self.asked += 1
        if self.release_after is not None and self.asked > self.release_after and self.marker.exists():
            self.marker.unlink()  # its memory is back: the candidate fits again
        held = self.marker.exists()
        return "nvidia-smi", ([{"pid": 4242, "name": "train.py", "memory_mib": self.gib * 1024}] if held else [])


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(gpu_share, "SHARED_OOM_WAIT_S", 0.6)
    monkeypatch.setattr(gpu_share, "SHARED_OOM_POLL_S", 0.05)
    monkeypatch.setattr(gpu_share, "free_bytes", lambda device: int(1.25 * GIB))

    def use(holder: Holder | None) -> None:
        monkeypatch.setattr(gpu_share, "others_holding",
                            holder.processes if holder else (lambda device, own_pid=None: ("nvml", [])))
    return use


def first_attempt(cand: Candidate):
    ev = run._attempt(task(), cand, ["compile", "verify"], {"device": "cpu", "baselines": False}, build)
    assert ev.verdict == "oom", ev.message  # what a real evaluation says before this rule
    return ev


def settle(ev, cand: Candidate, **options: Any):
    opts = {"device": "cpu", "baselines": False, **options}
    return run._shared_oom(ev, opts, lambda: run._attempt(task(), cand, ["compile", "verify"], opts, build),
                           bench._perf_counter_ns())


def test_memory_held_by_others_that_frees_is_retried_once(tmp_path, fake_gpu):
    holder = Holder(40, tmp_path / "held", release_after=3)
    fake_gpu(holder)
    cand = candidate(holder.marker)
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "correct", ev.message
    retry = ev.evidence["shared_oom_retry"]
    assert retry["processes"][0]["pid"] == 4242 and "Tried to allocate 2.00 GiB" in retry["first"]
    assert status(ev) == 0


def test_memory_that_stays_held_is_could_not_run_naming_the_holder(tmp_path, fake_gpu):
    holder = Holder(40, tmp_path / "held")
    fake_gpu(holder)
    cand = candidate(holder.marker)
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "not_run" and ev.correct is None
    assert ev.message.startswith(GPU_MEMORY_HELD), ev.message
    assert "pid 4242 (train.py) 40.0 GiB" in ev.message and "did not free within 1 s" in ev.message
    held = ev.evidence["gpu_memory_held"]
    assert held["retried"] is False and held["requested_bytes"] == 2 * GIB and 0.5 <= held["waited_s"] < 5
    assert status(ev) == 2  # could not run, not "a problem with your code"
    assert "not a verdict on the candidate" in evaluation_reason(ev)


def test_the_wait_fits_in_the_callers_deadline(tmp_path, fake_gpu):
    holder = Holder(40, tmp_path / "held")
    fake_gpu(holder)
    cand = candidate(holder.marker)
    ev = settle(first_attempt(cand), cand, deadline_s=1.0)  # no time left to wait and run again
    assert ev.verdict == "not_run" and ev.evidence["gpu_memory_held"]["waited_s"] < 0.3


def test_out_of_memory_alone_stays_oom(tmp_path, fake_gpu):
    fake_gpu(None)  # nobody else on the GPU
    marker = tmp_path / "held"
    marker.write_text("x")
    cand = candidate(marker)
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "oom" and status(ev) == 1


def test_a_request_larger_than_what_others_hold_stays_oom(tmp_path, fake_gpu):
    holder = Holder(4, tmp_path / "held")  # 4 GiB held; 500 GiB asked: the candidate's own
    fake_gpu(holder)
    cand = candidate(holder.marker, OOM.replace("2.00 GiB", "500.00 GiB"))
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "oom" and "gpu_memory_held" not in (ev.evidence or {})


def test_still_out_of_memory_after_the_retry_while_held_is_could_not_run(tmp_path, fake_gpu, monkeypatch):
    holder = Holder(40, tmp_path / "held")
    fake_gpu(holder)
    cand = candidate(holder.marker)
    # The wait sees memory free (the request fits), the retry runs out again, the holder is back.
    frees = iter([int(1.25 * GIB)] + [3 * GIB] + [int(1.25 * GIB)] * 50)
    monkeypatch.setattr(gpu_share, "free_bytes", lambda device: next(frees))
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "not_run" and ev.evidence["gpu_memory_held"]["retried"] is True
    assert "retried once" in ev.message


def test_the_process_list_excludes_this_process(monkeypatch):
    own = os.getpid()
    monkeypatch.setattr(gpu_share, "_device_uuid", lambda device: "GPU-1")
    monkeypatch.setattr(gpu_share, "query_processes", lambda uuid: ("nvml", [
        {"pid": own, "name": "python", "memory_mib": 3000.0}, {"pid": 77, "name": "bench", "memory_mib": 9000.0},
        {"pid": 78, "name": "idle", "memory_mib": 0.0}]))
    source, others = gpu_share.others_holding("cuda:0")
    assert source == "nvml" and [p["pid"] for p in others] == [77]
    # PIDs of another namespace (a container): the one holding about what we hold is us.
    monkeypatch.setattr(gpu_share, "query_processes", lambda uuid: ("nvidia-smi", [
        {"pid": 9001, "name": "python", "memory_mib": 520.0}, {"pid": 9002, "name": "bench", "memory_mib": 9000.0}]))
    monkeypatch.setattr(gpu_share, "_own_mib", lambda device: 512.0)
    assert [p["pid"] for p in gpu_share.others_holding("cuda:0")[1]] == [9002]


def test_requested_bytes_and_blame():
    assert gpu_share.requested_bytes(OOM) == 2 * GIB
    assert gpu_share.requested_bytes("std::bad_alloc") is None
    held = [{"pid": 1, "name": "x", "memory_mib": 10 * 1024}]
    assert gpu_share.blames_others(OOM, held, GIB)                                    # 2 <= 1 + 10
    assert not gpu_share.blames_others(OOM.replace("2.00 GiB", "12.00 GiB"), held, GIB)  # 12 > 1 + 10
    assert not gpu_share.blames_others(OOM, [], GIB)


# On the H200 (gVisor, a sandboxed Worker) the Worker's own process listing came back empty while
# torch's message named the holder: "Process 807 has 131.79 GiB memory in use".
NAMED = OOM + " Process 807 has 40.00 GiB memory in use. Of the allocated memory 16.00 MiB is allocated by PyTorch"


def test_holders_are_read_from_torchs_message_when_the_listing_is_empty(tmp_path, fake_gpu, monkeypatch):
    assert gpu_share.holders_in_message(NAMED) == [{"pid": 807, "name": "", "memory_mib": 40960.0}]
    assert gpu_share.holders_in_message(OOM) == []   # alone: torch names nobody
    fake_gpu(None)                                   # the listing: nobody
    marker = tmp_path / "held"
    marker.write_text("x")
    cand = candidate(marker, NAMED)
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "not_run" and "pid 807" in ev.message, ev.message
    assert ev.evidence["gpu_memory_held"]["source"] == "torch's out-of-memory message"
    # The holder lets go while we wait (free memory then fits the request): retried, correct.
    asked = {"n": 0}

    def free_now(device: Any) -> int:
        asked["n"] += 1
        if asked["n"] < 3:
            return int(1.25 * GIB)   # at the error, and the wait's first look
        marker.unlink(missing_ok=True)
        return 3 * GIB

    monkeypatch.setattr(gpu_share, "free_bytes", free_now)
    marker.write_text("x")
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "correct" and ev.evidence["shared_oom_retry"]["processes"][0]["pid"] == 807, ev.message


# The four sandboxed benches of a 6 GiB softmax on an H100 (2026-12-05): 79.18 GiB in all, 4.85 GiB
# free, this Worker 6.6 GiB; the Worker (its own PID namespace) listed no other process.
H100_TOTAL, H100_FREE, OWN_MIB = int(79.18 * GIB), int(4.85 * GIB), 6.6 * 1024


def recorded_card(monkeypatch, free: int, own_mib: float) -> None:
    monkeypatch.setattr(gpu_share, "free_bytes", lambda device: free)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, H100_TOTAL))
    monkeypatch.setattr(gpu_share, "_own_mib", lambda device: own_mib)


def test_memory_held_by_processes_a_sandboxed_worker_cannot_list_is_could_not_run(tmp_path, fake_gpu, monkeypatch):
    fake_gpu(None)  # the process list is empty: the sandbox hides the other processes
    recorded_card(monkeypatch, H100_FREE, OWN_MIB)
    unseen = gpu_share.unseen_holding("cuda:0")
    assert len(unseen) == 1 and unseen[0]["pid"] is None and 67 * 1024 < unseen[0]["memory_mib"] < 68 * 1024
    marker = tmp_path / "held"
    marker.write_text("x")
    cand = candidate(marker, "CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of "
                             "79.18 GiB of which 4.85 GiB is free. Including non-PyTorch memory, this process "
                             "has 6.60 GiB memory in use.")
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "not_run" and status(ev) == 2, ev.message
    assert f"({gpu_share.UNSEEN_NAME} 67." in ev.message and "pid None" not in ev.message, ev.message
    assert ev.evidence["gpu_memory_held"]["source"] == "free memory"


def test_what_a_worker_holds_itself_is_not_blamed_on_unseen_processes(tmp_path, fake_gpu, monkeypatch):
    fake_gpu(None)
    # Everything taken is this Worker's own, but a CUDA context larger than CONTEXT_MIB: within the margin.
    recorded_card(monkeypatch, H100_FREE, (H100_TOTAL - H100_FREE) / (1 << 20) - 1024)
    assert gpu_share.unseen_holding("cuda:0") == []
    marker = tmp_path / "held"
    marker.write_text("x")
    cand = candidate(marker)
    ev = settle(first_attempt(cand), cand)
    assert ev.verdict == "oom" and status(ev) == 1
