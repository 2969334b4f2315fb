"""Hostile CPU candidates in the real Worker and the real run module, inside bubblewrap.

Each one is stopped by a fence and its Evaluation says which; a normal candidate passes
with ``sandboxed: true``. HOME is a folder outside /tmp with a planted secret, the
workspace a folder with the task file, and a listener on 127.0.0.1 counts connections.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.engine.caller import sandbox as sb
from kernel_lsp.model import Candidate, Task
from tests.needs import needs_sandbox

pytestmark = needs_sandbox

SECRET = "SECRET-ssh-key-4711"
REFERENCE = '''\
import os
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''
LIMITS = sb.Limits(processes=64, file_mb=16, tmp_mb=32)


def candidate(init: str) -> Candidate:
    body = "\n".join("        " + line for line in init.strip("\n").splitlines())
    return Candidate(source=REFERENCE + f'''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{body}

    def forward(self, x):
        return x.clamp_min(0)
''', kind="python")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """HOME (outside /tmp, so that it is the home folder the sandbox hides, with a planted
    secret), a workspace with the task, and an Engine whose Workers use small limits."""
    home = Path(tempfile.mkdtemp(prefix="klsp-home-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None))
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "relu.py").write_text(REFERENCE)
    task = Task(name="relu", reference_path=str(ws / "relu.py"), reference_source=REFERENCE)
    yield {"home": home, "ws": ws, "task": task, "tmp": tmp_path}
    shutil.rmtree(home, ignore_errors=True)


async def evaluate(world, init: str, timeout: float = 120.0, **limits):
    spec = sb.Sandbox(limits=sb.Limits(**{**LIMITS.__dict__, **limits}))
    async with Engine(timeout=timeout, sandbox=spec, warm=False, prebuild=False) as engine:
        ev = await engine.evaluate(world["task"], candidate(init), checks=("compile", "verify"))
    text = json.dumps(ev.to_dict())
    assert SECRET not in text
    return ev


async def test_a_normal_candidate_passes_sandboxed(world):
    ev = await evaluate(world, "pass")
    assert ev.verdict == "correct" and ev.correct, ev.message
    assert ev.sandboxed is True and ev.summary()["sandboxed"] is True


async def test_writing_into_the_workspace_is_stopped(world):
    target = world["ws"] / "pwned.py"
    ev = await evaluate(world, f"open({str(target)!r}, 'w').write('import os')")
    assert ev.verdict == "sandbox_violation", ev.message
    assert "tried to write outside its scratch folder" in ev.message and "Read-only file system" in ev.message
    assert not target.exists() and ev.sandboxed


async def test_reading_a_file_in_home_is_stopped(world):
    secret = world["home"] / ".ssh" / "id_rsa"
    ev = await evaluate(world, f"self.leak = open({str(secret)!r}).read()\nraise RuntimeError(self.leak)")
    assert ev.verdict == "sandbox_violation", ev.message
    assert "tried to read the home folder" in ev.message


async def test_connecting_to_a_local_listener_is_stopped(world):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        ev = await evaluate(world, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)")
    finally:
        stop.set()
        thread.join(2)
        server.close()
    assert accepted == []
    assert ev.verdict == "sandbox_violation", ev.message
    assert "tried to use the network" in ev.message


async def test_a_fork_bomb_is_stopped(world):
    ev = await evaluate(world, "while True:\n    os.fork()", timeout=120.0)
    assert ev.verdict == "sandbox_violation", ev.message
    assert f"exceeded the process limit ({LIMITS.processes})" in ev.message


async def test_a_fork_bomb_that_ignores_errors_ends_at_the_deadline_with_the_reason(world):
    ev = await evaluate(world, "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                        timeout=15.0)
    assert ev.verdict == "sandbox_violation", ev.message
    assert f"exceeded the process limit ({LIMITS.processes})" in ev.message and "deadline" in ev.message


async def test_one_huge_file_hits_the_file_size_limit(world):
    ev = await evaluate(world, "with open('/tmp/fill', 'wb') as f:\n    while True:\n        f.write(b'0' * 1048576)")
    assert ev.verdict == "sandbox_violation", ev.message
    assert f"file size limit ({LIMITS.file_mb} MiB)" in ev.message


async def test_many_files_fill_the_scratch_space_not_the_disk(world):
    ev = await evaluate(world, "i = 0\nwhile True:\n    i += 1\n"
                               "    with open(f'/tmp/fill{i}', 'wb') as f:\n        f.write(b'0' * 8 * 1048576)")
    assert ev.verdict == "sandbox_violation", ev.message
    assert f"filled its scratch space (/tmp holds {LIMITS.tmp_mb} MiB)" in ev.message


async def test_a_precompiled_header_cache_in_home_stays_writable(world, monkeypatch):
    # KERNEL_LSP_PCH_CACHE apart from the build cache, inside the hidden home: without its own
    # bind, every sandboxed build would make the precompiled torch headers again.
    pch = world["home"] / "pch"
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch))
    ev = await evaluate(world, f"open({str(pch / 'probe')!r}, 'w').write('ok')")
    assert ev.verdict == "correct", ev.message
    assert (pch / "probe").read_text() == "ok"


async def test_the_build_cache_and_scratch_stay_writable(world):
    cache = world["tmp"] / "cache"
    ev = await evaluate(world, f"open({str(cache / 'probe')!r}, 'w').write('ok')\n"
                               "open('/tmp/scratch', 'w').write('ok')")
    assert ev.verdict == "correct", ev.message
    assert (cache / "probe").read_text() == "ok"
