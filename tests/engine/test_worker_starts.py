"""One Worker start per run, started early and overlapped (issue 21's loop in seconds).

- A sandboxed Worker shows the folders of the Tasks named before it started (``Engine.see``), and
  folders inside those or inside its working folder: the first evaluation does not replace it.
- `kernel-lsp bench` names its Tasks before `device_info` starts the Worker: one start per run.
- The GPU Worker overlaps CUDA's init with its imports (worker/early.py) and imports the
  evaluation modules before it says ready; build-pool Workers do neither.
- While the CPU pool builds, the GPU Worker starts (and compiles the reference's torch.compile
  baseline) instead of waiting for the build.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import sandbox as sb
from kernel_lsp.engine.caller.tasks import find_task
from kernel_lsp.engine.worker import early
from kernel_lsp.model import Candidate, Task
from tests.needs import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": ""}
CAND = Candidate(source="def run():\n    return 1\n", kind="python")


def test_a_sandbox_shows_folders_inside_its_bound_ones_and_its_working_folder():
    box = sb.Sandbox(readable=("/work/ws",))
    assert sb.shows(box, None, ["/work/ws"])
    assert sb.shows(box, None, ["/work/ws/sub/deeper"])        # a task in a subfolder of the project
    assert not sb.shows(box, None, ["/work/wsx"])              # a sibling that merely shares the prefix
    assert not sb.shows(box, None, ["/work/other"])
    assert sb.shows(box, "/home/me/proj", ["/home/me/proj/kernels"])  # the Worker's cwd is bound too
    assert not sb.shows(box, "/home/me/proj", ["/home/me/elsewhere"])
    assert sb.shows(None, None, ["/anything"])                 # no sandbox: everything is seen
    assert sb.shows(box, None, [])


def test_see_names_the_task_folders_before_any_worker_starts(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "sub").mkdir()
    task = Task(name="t", reference_path=str(tmp_path / "sub" / "t.py"), reference_source="# ref\n")
    engine = Engine(sandbox="off")
    engine.see([task, task])
    # tmp_path is under /tmp, which a sandbox hides: its project folder must be bound in, once.
    assert engine._readable == [str(tmp_path)]


@needs_sandbox
async def test_a_worker_started_before_the_task_is_named_is_replaced_and_see_prevents_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    task = Task(name="toy", reference_path=str(tmp_path / "toy.py"), reference_source="# reference\n")
    async with Engine(timeout=30.0, warm=False, env=FAKE, sandbox="auto") as engine:
        await engine.device_info()
        ev = await engine.evaluate(task, CAND)
        assert ev.verdict == "correct" and engine.restarts == 1  # the bad case: a second start
    async with Engine(timeout=30.0, warm=False, env=FAKE, sandbox="auto") as engine:
        engine.see([task])
        await engine.device_info()
        ev = await engine.evaluate(task, CAND)
        assert ev.verdict == "correct" and engine.restarts == 0


def test_cli_bench_starts_one_worker(tmp_path):
    """`kernel-lsp bench --timings`: the Worker starts before the evaluation (device_info) and
    the evaluation finds it: no "starting worker" step inside it (on a machine with bwrap the
    task's folder under /tmp is hidden, which made the first Worker useless)."""
    task = tmp_path / "toy.py"
    task.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return x + 1\n\n\n"
                    "def get_inputs():\n    return [torch.randn(8)]\n\n\ndef get_init_inputs():\n    return []\n\n\n"
                    "class ModelNew(Model):\n    pass\n")
    env = {**os.environ, **FAKE, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", str(task), "--json", "--timings"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout)
    phases = [p["phase"] for p in doc["timings"]["phases"]]
    assert any(p.startswith("starting the Worker") for p in phases), phases
    assert not [p for p in phases if p.endswith(("starting worker", "warming worker"))], phases
    assert doc["targets"][0]["verdict"] == "correct"
    # The phases came on stderr as they opened, before the table at the end.
    live = [line.split(" s: ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("kernel-lsp --timings: ")]
    assert "toy.py: evaluating" in live and proc.stderr.index("toy.py: evaluating") < proc.stderr.index("(seconds;"), \
        proc.stderr[-2000:]


async def test_the_cli_early_build_asks_nvidia_smi_off_the_event_loop(monkeypatch):
    """`kernel-lsp bench`'s early build: the arch comes from nvidia-smi in a thread (the Worker's
    start, begun by device_info, does not wait for it), and without one nothing is built early."""
    import threading

    from kernel_lsp import config
    from kernel_lsp.cli import bench as cli_bench

    loop_thread = threading.current_thread()
    asked: list[threading.Thread] = []
    built: list[dict] = []

    class FakeEngine:
        kind = "local"

        async def prebuild(self, task, cand, options, ahead=False):
            assert ahead  # for the evaluation to come: handed over with its steps (Engine.prebuild)
            built.append(options)

    task = Task(name="t", reference_source="x = 1\n", reference_path="/tmp/t.py")
    cuda = Candidate(source="__global__ void k() {}\n", kind="cuda")
    rows = [("t.py", task, cuda, "")]
    opts = {"compile_mode": "default"}  # the evaluation's own: the same build request
    for arch, want in (("sm_90", [{"compile_mode": "default", "arch": "sm_90"}]), (None, [])):
        built.clear()

        def detect(arch=arch):
            asked.append(threading.current_thread())
            return arch
        monkeypatch.setattr(config, "detect_arch", detect)
        fut = cli_bench._early_prebuild(FakeEngine(), rows, opts)
        assert fut is not None
        await fut
        assert built == want
    assert asked and all(t is not loop_thread for t in asked)
    assert cli_bench._early_prebuild(FakeEngine(), [("t.py", task, None, "")], opts) is None  # nothing to build


def test_only_the_engines_gpu_worker_initializes_cuda_early(monkeypatch):
    assert early.wanted({protocol.WORKER_ROLE_ENV: protocol.GPU_ROLE})
    assert not early.wanted({protocol.WORKER_ROLE_ENV: protocol.GPU_ROLE, "CUDA_VISIBLE_DEVICES": ""})  # the pool
    assert not early.wanted({})


def test_the_device_facts_read_nvidia_smi_through_early(monkeypatch):
    """A GPU's clocks (every device_info) and its fixed facts where the start's thread did not read
    them (a Worker without the GPU role) come from early.nvidia_smi; the CUDA branch, on a CPU."""
    from kernel_lsp.engine.worker import run

    asked: list[str] = []

    def smi(fields: str) -> list[str]:
        asked.append(fields)
        return ["535.1", "1980", "2619"] if fields == early.STATIC_FIELDS else ["1755", "2619", "41", "120.5"]

    monkeypatch.setattr(early, "nvidia_smi", smi)
    monkeypatch.setattr(early, "static_smi", lambda: None)
    monkeypatch.setattr(run, "_static_device_info", lambda index: {"cuda": True, "index": index})
    run._static_smi.cache_clear()
    try:
        info = run.device_info("cuda:0")
        assert info["sm_clock_mhz"] == 1755.0 and info["power_w"] == 120.5 and info["clocks_source"] == "nvidia-smi"
        assert run._static_smi() == ["535.1", "1980", "2619"]
        assert asked == ["clocks.sm,clocks.mem,temperature.gpu,power.draw", early.STATIC_FIELDS]
    finally:
        run._static_smi.cache_clear()


async def test_the_gpu_worker_imports_the_evaluation_modules_before_it_is_ready():
    """The Engine's Worker (default preload) answers `ping` with the run module already imported
    and its `warm` says what the early CUDA init did (here: no driver, or ready on a GPU)."""
    async with Engine(timeout=120.0, warm=True, sandbox="off") as engine:
        info = await engine.request("ping", timeout=120.0, warm=True)
        assert "run" in info["preloaded"] and info["torch_imported"]
        warm = engine._worker.warm
        assert warm["early_cuda"]["state"] in ("ready", "no driver", "no device", "failed")
    # A Worker without the GPU role (the build pool's way) imports only what it is told to.
    async with Engine(timeout=60.0, warm=False, sandbox="off",
                      env={protocol.WORKER_ROLE_ENV: "pool", "KERNEL_LSP_WORKER_PRELOAD": ""}) as engine:
        info = await engine.ping(timeout=60.0)
        assert "run" not in info["preloaded"]


async def test_the_worker_starts_while_the_pool_builds(tmp_path):
    """An evaluation that prebuilds starts the GPU Worker at once, not after the build: the
    Worker is up before the (slow) build ends."""
    (tmp_path / "pyproject.toml").write_text("")
    slow = ("import time\n# cpp_extension: worth a prebuild\n"
            "time.sleep(float(__import__('os').environ.get('KERNEL_LSP_TEST_BUILD_S', '0')))\n"
            "def run():\n    return 2\n")
    cand = Candidate(source=slow, kind="python")
    task = Task(name="toy", reference_path=str(tmp_path / "toy.py"), reference_source="# reference\n")
    env = {**FAKE, "KERNEL_LSP_TEST_BUILD_S": "4"}
    async with Engine(timeout=60.0, warm=False, env=env, sandbox="off") as engine:
        started: list[float] = []
        real_start = engine.start

        async def start() -> bool:
            ok = await real_start()
            started.append(time.monotonic())
            return ok
        engine.start = start  # type: ignore[method-assign]
        steps: list[tuple[str, float]] = []
        ev = await engine.evaluate(task, cand, progress=lambda s: steps.append((s, time.monotonic())))
        built = next(t for s, t in steps if s == "evaluating")
    assert ev.verdict == "correct", ev.message
    assert started and started[0] < built - 2.0, (started, steps)  # up while the build still ran


async def test_prepare_reference_compiles_the_baseline_ahead_unless_a_kept_one_matches(tmp_path):
    """The `prepare_reference` op (sent while the pool builds) compiles the reference's
    torch.compile on the timing inputs; the evaluation's own compile of a fresh model then
    finds the work done. With a kept baseline that matches, it does nothing."""
    from kernel_lsp.engine.caller.baselines import to_keep
    from tests.cpu_task import TASK

    pytest.importorskip("torch")
    path = tmp_path / "rowsum.py"
    path.write_text(TASK)
    task, cand = find_task(str(path), TASK)
    opts = {"device": "cpu"}
    async with Engine(timeout=240.0, sandbox="off", prebuild=False) as engine:
        got = await engine.request("prepare_reference", {"task": task.to_dict(), "options": opts},
                                   timeout=240.0, warm=True)
        assert got["state"] == "compiled", got
        ev = await engine.evaluate(task, cand, options=opts)
        assert ev.verdict == "correct", ev.message
        phases = ev.evidence["phases"]
        # the first compile in the process paid the imports and the codegen; this one finds them
        assert phases["torch_compile_s"] < got["seconds"], (phases, got)
        record = to_keep(ev) or {**ev.baselines, "cached": None}
        again = await engine.request("prepare_reference", {"task": task.to_dict(), "options": {
            **opts, protocol.CACHED_BASELINES: [record]}}, timeout=240.0, warm=True)
        assert again == {"state": "skipped", "why": "a kept baseline matches"}


def test_prepare_reference_loads_the_reference_without_the_modelnew_sharing_its_file(tmp_path):
    """In a file that holds both, the ModelNew's statements (its load_inline builds) are left out,
    lines kept; a module-level patch of a function the judgement trusts is put back after."""
    torch = pytest.importorskip("torch")
    from kernel_lsp.engine.worker.build import build
    from kernel_lsp.engine.worker import run
    from tests.cpu_task import TASK

    same_file = TASK.replace("class ModelNew(nn.Module):",
                             "ext = (_ for _ in ()).throw(RuntimeError('the ModelNew part ran'))\n"
                             "torch.nn.functional.gelu = lambda x: x\n\n\nclass ModelNew(nn.Module):")
    own = protocol.reference_only_source(same_file)
    assert own is not None and "ModelNew" not in own and "the ModelNew part ran" not in own
    assert len(own.splitlines()) == len(same_file.splitlines())
    assert protocol.reference_fingerprint(own) == protocol.reference_fingerprint(same_file)
    path = tmp_path / "both.py"
    path.write_text(same_file)
    task, cand = find_task(str(path), same_file)
    real = torch.nn.functional.gelu
    got = run.prepare_reference(task, {"device": "cpu"}, build)
    assert got["state"] == "compiled", got
    assert torch.nn.functional.gelu is real  # the reference's own patch, put back


async def test_get_ready_ahead_compiles_the_reference_while_a_build_runs_elsewhere(tmp_path):
    """`kernel-lsp bench` waits for its early build in the CPU pool; meanwhile
    `Engine.get_ready_ahead` has the Worker compile the reference's torch.compile baseline (in the
    background), once: the evaluation after the build does not ask again."""
    from tests.cpu_task import TASK

    pytest.importorskip("torch")
    path = tmp_path / "rowsum.py"
    path.write_text(TASK)
    task, cand = find_task(str(path), TASK)
    opts = {"device": "cpu"}
    async with Engine(timeout=240.0, sandbox="off") as engine:
        sent: list[str] = []
        real = engine._call_now

        async def spy(w, op, params, deadline, **kw):
            sent.append(op)
            return await real(w, op, params, deadline, **kw)
        engine._call_now = spy  # type: ignore[method-assign]
        engine.get_ready_ahead(task, ("compile", "verify", "bench"), opts)
        assert engine._readying  # in the background: the caller goes on (to wait for its build)
        await asyncio.gather(*list(engine._readying))
        assert "prepare_reference" in sent, sent
        ev = await engine.evaluate(task, cand, options=opts)
    assert ev.verdict == "correct", ev.message
    assert sent.count("prepare_reference") == 1 and sent[-1] == "evaluate", sent



async def test_the_reference_is_prepared_ahead_only_on_an_idle_gpu(tmp_path, monkeypatch):
    """Six benches at once on an H100: a prepare_reference held the GPU 15 s compiling while five
    others waited, and its evaluation compiled again. With another process on the GPU now, it is
    not prepared ahead (the evaluation compiles it in its own turn); on an idle GPU it is, holding
    the machine-wide turn. A real lock, a real holder process; the Worker runs on the CPU with the
    GPU's key set by hand."""
    from kernel_lsp.engine.caller import gpu_lock
    from tests.cpu_task import TASK
    from tests.engine.test_gpu_lock import HOLD  # a process that holds a GPU's turn

    pytest.importorskip("torch")
    monkeypatch.setenv("KERNEL_LSP_GPU_LOCK_DIR", str(tmp_path / "locks"))
    path = tmp_path / "rowsum.py"
    path.write_text(TASK)
    task, cand = find_task(str(path), TASK)
    opts = {"device": "cpu"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                     os.environ.get("PYTHONPATH")]))}

    lent: list[tuple] = []

    async def run(busy: bool) -> tuple[list[str], list[str | None], int]:
        async with Engine(timeout=240.0, sandbox="off") as engine:
            async def key(progress=None) -> str:
                return "GPU-prepare"
            engine._gpu_key = key  # type: ignore[method-assign]
            await engine.start()
            sent: list[str] = []
            holders: list[str | None] = []
            lent.clear()
            real = engine._call_now

            async def spy(w, op, params, deadline, **kw):
                sent.append(op)
                holders.append((gpu_lock.holder(gpu_lock.lock_path("GPU-prepare")) or {}).get("op"))
                if op == "prepare_reference":  # asked for the turn points around its compile
                    lent.append(((params.get("options") or {}).get(protocol.YIELD_TURNS), kw.get("turn")))
                return await real(w, op, params, deadline, **kw)
            engine._call_now = spy  # type: ignore[method-assign]
            holder = None
            if busy:
                holder = subprocess.Popen([sys.executable, "-c", HOLD, "GPU-prepare", "8"], env=env,
                                          stdout=subprocess.PIPE, text=True)
                assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            try:
                engine.get_ready_ahead(task, ("compile", "verify", "bench"), opts)
                await asyncio.gather(*list(engine._readying))
            finally:
                if holder is not None:
                    holder.wait(30)
            return sent, holders, engine.prepare_skipped

    sent, _, skipped = await run(busy=True)
    assert "prepare_reference" not in sent and skipped == 1, sent
    sent, holders, skipped = await run(busy=False)
    assert sent.count("prepare_reference") == 1 and skipped == 0, sent
    assert holders[sent.index("prepare_reference")] == "prepare_reference"  # it held the turn
    # ... and lends it, should a process queue while torch.compile compiles (its turn points).
    [(asked, turn)] = lent
    assert asked is True and isinstance(turn, gpu_lock.Turn) and turn.key == "GPU-prepare"
