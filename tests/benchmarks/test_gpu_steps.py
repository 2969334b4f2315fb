"""benchmarks/gpu_steps.sh on the CPU: a step cut at its cap is stopped with everything it
started, even what ignores SIGTERM (`timeout` alone sends SIGTERM only), and the next step
still runs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_cut_step_is_stopped_with_its_children_and_the_next_step_runs(tmp_path):
    pids = tmp_path / "pids"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_STEPS_NO_INSTALL": "1", "STEPS": "sh_slow:2 sh_next:30",
           "sh_slow": f"(trap '' TERM; sleep 300) & echo $! > {pids}; sleep 300", "sh_next": "echo next step ran"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_steps.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "== sh_slow rc=124" in proc.stdout and "next step ran" in proc.stdout and "== sh_next rc=0" in proc.stdout
    assert time.monotonic() - t0 < 60
    child = int(pids.read_text())
    assert not _alive(child), f"the cut step's child {child} still runs"
    assert (tmp_path / "out" / "logs.tgz").exists()


def test_a_pytest_steps_arguments_keep_their_quotes(tmp_path):
    """`py_n="tests/... -k 'max_autotune or unsplit'"` reached pytest as the words `'max_autotune`,
    `or`, `unsplit'` (pytest: "file or directory not found: or", no test ran); the step's
    arguments are now parsed as a shell command line."""
    import sys

    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_STEPS_NO_INSTALL": "1", "STEPS": "py_k:60",
           "py_k": "tests/benchmarks/test_gpu_steps.py -k 'cut_step or keep_their_quotes'",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_steps.sh")], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    log = (tmp_path / "out" / "logs" / "py_k.log").read_text()
    assert "not found" not in log, log
    assert "2 deselected" in log and "== py_k rc=5" in proc.stdout, (log, proc.stdout)  # -m gpu: none left
