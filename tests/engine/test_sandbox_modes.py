"""The sandbox setting (required | auto | off), its status and install hint, the bwrap
command line, and the CLI's exit 2 when a required sandbox is missing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.config import Settings, SettingsError, load_settings
from kernel_lsp.engine import Engine
from kernel_lsp.engine.caller import sandbox as sb
from kernel_lsp.engine.worker import fences
from kernel_lsp.engine.worker.main import Worker
from kernel_lsp.model import Candidate, Evaluation, Task
from tests.needs import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": ""}
TASK = Task(name="toy", reference_path="toy.py", reference_source="# reference\n")
CAND = Candidate(source="def run():\n    return 1\n", kind="python")


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """PATH without bwrap (the interpreter's folder only)."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    sb._status_cache.clear()
    sb._warned.clear()
    yield
    sb._status_cache.clear()
    sb._warned.clear()


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (which the sandbox hides whole), like a real home folder."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="klsp-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_status_without_bwrap_says_how_to_install(no_bwrap):
    st = sb.status()
    assert not st.available and "not installed" in st.reason and "apt-get install bubblewrap" in st.hint
    assert "WITHOUT a sandbox" in st.message() and st.to_dict()["available"] is False


def test_required_without_bwrap_refuses(no_bwrap):
    with pytest.raises(sb.SandboxUnavailable, match="apt-get install bubblewrap"):
        sb.resolve("required")
    with pytest.raises(sb.SandboxUnavailable):
        sb.resolve(sb.Sandbox())
    assert sb.resolve("off") is None
    with pytest.raises(ValueError):
        sb.resolve("sometimes")


async def test_engine_required_without_bwrap_raises_and_runs_nothing(no_bwrap):
    async with Engine(timeout=20.0, warm=False, env=FAKE, sandbox="required") as engine:
        with pytest.raises(sb.SandboxUnavailable):
            await engine.evaluate(TASK, CAND)
        assert engine.worker_pid is None


async def test_auto_without_bwrap_warns_once_and_records_unsandboxed(no_bwrap, caplog):
    caplog.set_level(logging.WARNING, logger="kernel_lsp.engine.caller.sandbox")
    async with Engine(timeout=20.0, warm=False, env=FAKE, sandbox="auto") as engine:
        ev = await engine.evaluate(TASK, CAND)
    async with Engine(timeout=20.0, warm=False, env=FAKE, sandbox="auto") as engine:
        ev2 = await engine.evaluate(TASK, CAND)
    assert ev.verdict == ev2.verdict == "correct"
    assert ev.sandboxed is False and ev.summary()["sandboxed"] is False
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT a sandbox" in r.getMessage()]
    assert len(warnings) == 1 and "apt-get install bubblewrap" in warnings[0]


@needs_sandbox
async def test_auto_with_bwrap_is_sandboxed_and_off_is_not():
    async with Engine(timeout=20.0, warm=False, env=FAKE) as engine:  # the workspace's setting: auto
        ev = await engine.evaluate(TASK, CAND)
    async with Engine(timeout=20.0, warm=False, env=FAKE, sandbox="off") as engine:
        off = await engine.evaluate(TASK, CAND)
    assert ev.verdict == off.verdict == "correct"
    assert ev.sandboxed is True and off.sandboxed is False


def test_cli_required_without_bwrap_exits_2_with_the_install_message(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\nsandbox = "required"\n')
    (tmp_path / "relu.py").write_text(
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
        "def get_inputs():\n    return [torch.randn(8, 8)]\n"
        "def get_init_inputs():\n    return []\n")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", "relu.py"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert 'sandbox = "required"' in out.stderr and "apt-get install bubblewrap" in out.stderr


def test_setting_values():
    assert Settings().sandbox == "auto"
    assert Settings().merged({"sandbox": "required"}).sandbox == "required"
    with pytest.raises(SettingsError, match="sandbox"):
        Settings().merged({"sandbox": "yes"})


def test_a_bad_setting_is_refused_like_a_missing_sandbox(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\nsandbox = "maybe"\n')
    with pytest.raises(sb.SandboxUnavailable, match="sandbox"):
        sb.configured_mode(str(tmp_path))
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\nsandbox = "off"\n')
    assert sb.configured_mode(str(tmp_path)) == "off" and load_settings(tmp_path).sandbox == "off"


@needs_sandbox
def test_command_line_fences(outside_tmp):
    home = outside_tmp / "home"
    venv = home / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.symlink_to(sys.executable)
    ws = home / "project"
    ws.mkdir()
    (home / ".local" / "bin").mkdir(parents=True)
    env = {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/bin", "USER": "me", "CUDA_VISIBLE_DEVICES": "0"}
    launch = sb.wrap([str(python), "-m", "kernel_lsp.engine.worker"], env, str(ws),
                     sb.Sandbox(readable=(str(ws),)))
    argv = launch.argv
    assert argv[argv.index("--") + 1:] == [str(python), "-m", "kernel_lsp.engine.worker"]
    assert "--unshare-all" in argv and "--die-with-parent" in argv and "--share-net" not in argv
    binds = dict(launch.binds)
    assert binds[str(home / "venv")] == "ro" and binds[str(ws)] == "ro"       # the env and the workspace
    assert binds[str(home / ".local" / "bin")] == "ro"                         # tools on PATH (ninja)
    assert binds[str(home / ".cache" / "kernel-lsp")] == "rw"                 # the build caches
    assert binds[str(home / ".cache" / "torch_extensions")] == "rw"
    assert binds[str(home / ".triton" / "cache")] == "rw"
    assert argv[argv.index(str(home)) - 1] == "--tmpfs"                      # home hidden
    assert argv[argv.index("/tmp") - 1] == "--tmpfs"
    assert launch.env["TMPDIR"] == "/tmp" and launch.env["TORCHINDUCTOR_CACHE_DIR"].endswith("torchinductor_me")
    assert '"address_space_mb": 0' in launch.env[sb.ENV]                    # a GPU Worker: no RLIMIT_AS
    for node in sb.gpu_nodes():
        assert argv[argv.index(node) - 1] == "--dev-bind"
    pool = sb.wrap(["python"], {**env, "CUDA_VISIBLE_DEVICES": ""}, None, sb.Sandbox())
    assert '"address_space_mb": 32768' in pool.env[sb.ENV]


def test_gpu_nodes_pass_through_with_dev_bind(monkeypatch):
    monkeypatch.setattr(sb, "gpu_nodes", lambda: ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    monkeypatch.setattr(sb, "find_bwrap", lambda path=None: "/usr/bin/bwrap")
    argv = sb.wrap(["python"], {"HOME": "/nonexistent-home"}, None, sb.Sandbox()).argv
    for node in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"):
        assert argv[argv.index(node) - 1] == "--dev-bind" and argv[argv.index(node) + 1] == node


def test_explain_names_each_fence():
    conf = {"processes": 64, "file_mb": 16, "tmp_mb": 32, "home": "/home/me"}
    assert "process limit (64)" in fences.explain("BlockingIOError: [Errno 11] Resource temporarily unavailable", conf)
    assert "file size limit (16 MiB)" in fences.explain("OSError: [Errno 27] File too large", conf)
    assert "scratch space" in fences.explain("OSError: [Errno 28] No space left on device", conf)
    assert "write outside" in fences.explain("OSError: [Errno 30] Read-only file system: '/w/x'", conf)
    assert "network" in fences.explain("ConnectionRefusedError: [Errno 111] Connection refused", conf)
    assert "home folder" in fences.explain("FileNotFoundError: [Errno 2] No such file: '/home/me/.ssh/id'", conf)
    assert fences.explain("FileNotFoundError: [Errno 2] No such file: '/data/x'", conf) is None
    assert fences.explain("ValueError: shapes differ", conf) is None
    assert fences.explain("OSError: [Errno 30] Read-only file system", None) is None or fences.inside() is not None


def test_test_only_ops_are_not_in_the_production_table():
    ops = set(Worker().ops)
    assert ops == {"ping", "warm", "device_info", "evaluate", "profile", "build", "extract", "shutdown",
                   "prepare_build", "prepare_reference", "prepare_compile",
                   "prebuild_binding",  # a new file's main.cpp by signature, its load_inline calls read, not run
                   "inductor_code",  # the no-LLM path: torch.compile's code for a Task, in the Worker
                   "task_need"}  # a Task's GPU need, sized on meta before its turn (caller/gpu_lock)


def test_evaluation_carries_sandboxed():
    ev = Evaluation(task="t", candidate="c", sandboxed=True)
    assert Evaluation.from_dict(ev.to_dict()).sandboxed is True and ev.summary()["sandboxed"] is True
    assert Evaluation.from_dict({"task": "t", "candidate": "c"}).sandboxed is False  # older records
    assert "sandbox_violation" in __import__("kernel_lsp.model", fromlist=["VERDICTS"]).VERDICTS


def test_a_hidden_folder_itself_is_never_bound_back(outside_tmp):
    env = {"HOME": str(outside_tmp), "PATH": "/usr/bin"}
    assert sb.hidden("/tmp/x/y.py", env) and sb.hidden(str(outside_tmp / "proj"), env)
    assert not sb.hidden("/tmp", env) and not sb.hidden(str(outside_tmp), env) and not sb.hidden("/usr", env)


@needs_sandbox
def test_a_hidden_folder_is_not_bound_into_the_launch(outside_tmp):
    env = {"HOME": str(outside_tmp), "PATH": "/usr/bin"}
    launch = sb.wrap(["python"], env, None, sb.Sandbox(readable=("/tmp", str(outside_tmp)), writable=("/",)))
    bound = [q for q, _ in launch.binds]
    assert "/tmp" not in bound and str(outside_tmp) not in bound and "/" not in bound


def test_no_import_cycle_between_client_and_pool():
    code = ("import sys, kernel_lsp.engine.caller.pool, kernel_lsp.engine.worker\n"
            "assert 'kernel_lsp.engine.caller.client' not in sys.modules, 'pool or worker imports the client'\n"
            "import kernel_lsp.engine.caller.client\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_server_required_without_bwrap_is_execution_disabled_with_the_hint(no_bwrap, tmp_path):
    pytest.importorskip("pygls")
    from kernel_lsp.server.engine_host import EngineHost, ExecutionDisabled

    class Server:  # the two attributes EngineHost reads
        settings = Settings(sandbox="required")
        root = str(tmp_path)

    host = EngineHost(Server())  # type: ignore[arg-type]
    with pytest.raises(ExecutionDisabled, match="apt-get install bubblewrap"):
        host.engine()
    Server.settings = Settings(sandbox="off")
    assert host.engine().sandbox_mode == "off"


@needs_sandbox
async def test_a_sandbox_that_cannot_start_is_not_run_not_a_crash(monkeypatch):
    real = sb.wrap

    def broken(*args, **kwargs):
        launch = real(*args, **kwargs)
        cut = launch.argv.index("--")
        launch.argv[cut:cut] = ["--ro-bind", "/nonexistent-klsp", "/nonexistent-klsp"]
        return launch

    monkeypatch.setattr(sb, "wrap", broken)
    async with Engine(timeout=20.0, warm=False, env=FAKE, sandbox="required") as engine:
        ev = await engine.evaluate(TASK, CAND)
    assert ev.verdict == "not_run" and "the sandbox could not start" in ev.message, ev.message
    assert "nonexistent-klsp" in ev.message


def test_workspace_of_is_the_project_a_task_belongs_to(tmp_path: Path) -> None:
    from kernel_lsp.engine.caller.sandbox import workspace_of

    env = {"HOME": str(tmp_path / "home")}
    proj = tmp_path / "home" / "proj"
    (proj / ".kernel-lsp" / "ops").mkdir(parents=True)
    (proj / "pkg").mkdir()
    (proj / "pyproject.toml").write_text("")
    # an op Task imports its model two folders up: the project is readable, not just ops/
    assert workspace_of(str(proj / ".kernel-lsp" / "ops" / "m_fc.py"), env) == str(proj)
    assert workspace_of(str(proj / "pkg" / "k.py"), env) == str(proj)
    # no project marker below HOME: the file's own folder (HOME itself is never bound back)
    (tmp_path / "home" / "loose").mkdir()
    assert workspace_of(str(tmp_path / "home" / "loose" / "k.py"), env) == str(tmp_path / "home" / "loose")
    assert workspace_of(str(tmp_path / "home" / "k.py"), env) == str(tmp_path / "home")


def test_server_auto_without_bwrap_tells_the_user_once_how_to_install(no_bwrap, tmp_path):
    pytest.importorskip("pygls")
    from kernel_lsp.server.engine_host import EngineHost

    shown: list[str] = []

    class Server:  # what EngineHost reads, and the message it shows
        settings = Settings(sandbox="auto")
        root = str(tmp_path)

        def show(self, message: str, kind: object = None) -> None:
            shown.append(message)

    host = EngineHost(Server())  # type: ignore[arg-type]
    first = host.engine()
    assert host.engine() is first  # the same Engine: nothing said twice
    assert len(shown) == 1 and "WITHOUT a sandbox" in shown[0] and "bubblewrap" in shown[0], shown
