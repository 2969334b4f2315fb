"""The language server with `executor = "ray"`, over stdio with a real LSP client, against real
local Ray clusters on 127.0.0.1 (conftest.py): an unreachable address is one clear message and
the evaluation runs on this machine; a changed setting connects without a restart and the next
evaluation runs on the cluster, the hover and lens tooltip naming the node; a cluster lost
mid-session turns the status to "lost" and evaluations go on locally."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.agent.openai_server import start as start_llm
from tests.cpu_task import FASTER, TASK, fenced
from tests.lsp_client import EditorClient, config, wait_for

from .cluster import LocalCluster, free_port
from .conftest import GPU_KIND, TOKEN

pytestmark = [pytest.mark.slow]

MARK = f"klsp-server-{os.getpid()}-{time.time_ns()}"  # finds any Ray process the server starts itself
LLM = start_llm([fenced("one mv", FASTER), fenced("one mv, again", FASTER.replace("ones)", "ones.clone())"))])
# A Ray Client connection to a fresh head can take over 30 s on a loaded 2-core CI machine.
ENV = {**os.environ, "KLSP_TEST_MARK": MARK, "OPENAI_API_KEY": "sk-test-ray-server",
       "KERNEL_LSP_RAY_CONNECT_TIMEOUT": "150", "KERNEL_LSP_CACHE": os.path.join(os.environ.get("TMPDIR", "/tmp"), "kernel-lsp-test-cache")}
FAST = {"onSave": ["verify", "bench"], "timeout": 120, "arch": "sm_90", "gpu": GPU_KIND, "proposer": "llm",
        "agent": {"model": "scripted-model", "baseUrl": LLM.base_url, "budget": 2}}


async def start(client: EditorClient, root: Path, options: dict[str, Any]) -> None:
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="ws")],
        initialization_options=options))
    client.workspace_root = root


@pytest_lsp.fixture(config=config(env=ENV))
async def client(lsp_client: EditorClient, tmp_path: Path):
    yield
    await lsp_client.shutdown_session()


def open_and_save(client: EditorClient, name: str, text: str) -> str:
    path = client.workspace_root / name
    path.write_text(text)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    return uri


async def numbers_lens(client: EditorClient, uri: str, timeout: float = 240) -> types.Command:
    async def found() -> types.Command | None:
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        return next((lens.command for lens in lenses or []
                     if lens.command and lens.command.title.startswith("correct ·")), None)
    return await wait_for(found, timeout=timeout, interval=0.3, what="the measured numbers' lens")


async def hover(client: EditorClient, uri: str) -> str:
    line = next(i for i, l in enumerate(TASK.splitlines()) if l.startswith("class ModelNew("))
    result = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)))
    return result.contents.value if result else ""


def cluster_state(client: EditorClient) -> dict[str, Any]:
    for status in reversed(client.statuses):
        cluster = status.get("cluster") if isinstance(status, dict) else getattr(status, "cluster", None)
        if cluster is not None or "cluster" in (status if isinstance(status, dict) else {}):
            return cluster or {}
    return {}


async def until_connected(client: EditorClient, predicate: Any = None, timeout: float = 180) -> dict[str, Any]:
    """The cluster's status once connected; on a timeout, what the server said instead."""
    try:
        return await wait_for(predicate or (lambda: cluster_state(client).get("state") == "connected"
                                            and cluster_state(client)),
                              timeout=timeout, interval=0.2, what="the status saying the cluster is connected")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: cluster {cluster_state(client)}; messages "
                             f"{[m.message for m in client.messages]}") from None


def said(client: EditorClient, words: str) -> list[str]:
    return [m.message for m in client.messages if words in m.message]


async def test_unreachable_falls_back_at_once_then_a_setting_connects_without_a_restart(client: EditorClient,
                                                                                         cluster, tmp_path: Path):
    dead = f"ray://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    await start(client, tmp_path, {**FAST, "executor": "ray", "rayAddress": dead})
    uri = open_and_save(client, "rowsum.py", TASK)

    # One clear sentence, and the evaluation runs here meanwhile: no hang.
    warning = await wait_for(lambda: said(client, "cannot reach the Ray cluster"), timeout=60,
                             what="the unreachable message")
    assert dead in warning[0] and "run on this machine instead" in warning[0], warning
    print(f"unreachable said after {time.monotonic() - t0:.1f} s")
    assert cluster_state(client).get("state") == "unreachable"
    lens = await numbers_lens(client, uri, timeout=120)
    assert time.monotonic() - t0 < 120
    assert "ran on this machine" in (lens.tooltip or ""), lens
    assert "ran on this machine" in await hover(client, uri)

    # The setting changes: the server connects to the cluster (no restart) ...
    address = f"ray://127.0.0.1:{cluster.client_port}"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"kernelLsp": {**FAST, "executor": "ray", "rayAddress": address}}))
    latencies: list[float] = []

    async def connected_while_hovering() -> dict[str, Any] | None:
        t = time.monotonic()  # the server answers while ray.init and the actors' warm-up run
        assert "ModelNew" in await hover(client, uri)
        latencies.append(time.monotonic() - t)
        return cluster_state(client).get("state") == "connected" and cluster_state(client)

    up = await until_connected(client, connected_while_hovering)
    assert up["address"] == address and up["gpus"] == 2, up
    assert len(latencies) > 3 and max(latencies) < 1.0, latencies
    print(f"connected after {sum(latencies) + 0.2 * len(latencies):.1f} s; {len(latencies)} hovers meanwhile, "
          f"slowest {max(latencies) * 1000:.0f} ms")

    # ... and the next evaluation runs there: the hover and the lens tooltip name the node.
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.benchmark", arguments=[{"uri": uri}]))
    assert result["verdict"] == "correct" and result["executor"] == "ray", result
    assert "127.0.0.1" in result["node"], result
    lens = await numbers_lens(client, uri, timeout=30)
    assert "ran on the Ray cluster, node 127.0.0.1" in (lens.tooltip or ""), lens
    text = await hover(client, uri)
    assert "ran on the Ray cluster, node 127.0.0.1" in text and "GPU" in text, text
    # The status entry (VS Code's lens tooltip and status bar) says it too.
    entry = next(d for d in client.statuses[-1]["documents"] if d["uri"] == uri)
    assert entry["where"].startswith("ran on the Ray cluster, node 127.0.0.1"), entry

    # Optimize from the editor: the Search asks for two children at once (the cluster's two GPU
    # actors) and evaluates them there.
    before = len(LLM.requests)
    summary = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.optimize", arguments=[{"uri": uri}]))
    assert summary.get("improved"), summary
    asked = LLM.requests[before:]
    assert len(asked) == 2 and abs(asked[1]["time"] - asked[0]["time"]) < 2.0, asked  # one expansion, not two
    from kernel_lsp.store import Store

    store = Store.for_workspace(str(tmp_path))
    try:
        evs = [ev for ev in store.evaluations("rowsum.py", limit=50) if ev.candidate == summary["best"]]
    finally:
        store.close()
    assert evs and all(ev.executor == "ray" and "127.0.0.1" in (ev.node or "") for ev in evs), evs


@pytest.fixture
def own_cluster():
    """A cluster of its own (the shared one must outlive this test): one head declaring a GPU."""
    c = LocalCluster(token=TOKEN)
    try:
        c.start_head(num_cpus=1, num_gpus=1, resources={f"accelerator_type:{GPU_KIND}": 1})
        yield c
    finally:
        c.stop()


async def test_a_cluster_lost_mid_session_says_lost_and_evaluations_go_on_here(client: EditorClient, own_cluster,
                                                                                tmp_path: Path):
    address = f"ray://127.0.0.1:{own_cluster.client_port}"
    await start(client, tmp_path, {**FAST, "executor": "ray", "rayAddress": address})
    up = await until_connected(client)
    assert up["address"] == address and up["gpus"] == 1, up

    t0 = time.monotonic()
    own_cluster.stop_node(own_cluster.nodes[0])  # the head goes: the whole cluster is lost
    gone = time.monotonic()  # its processes are gone (SIGTERM, then SIGKILL after 30 s)
    lost = await wait_for(lambda: cluster_state(client).get("state") == "lost" and cluster_state(client),
                          timeout=60, what="the status saying the cluster is lost")
    assert lost["address"] == address and "stopped answering" in lost["message"], lost
    assert time.monotonic() - gone < 30  # the watchdog's period (5 s) plus its check's timeout (15 s)
    print(f"lost said {time.monotonic() - gone:.1f} s after the head's processes were gone "
          f"({time.monotonic() - t0:.1f} s after it was told to stop)")
    await wait_for(lambda: said(client, "evaluations run on this machine until it answers again"), timeout=10,
                   what="the lost message")

    # Evaluations keep working, on this machine, and say so.
    uri = open_and_save(client, "rowsum.py", TASK)
    lens = await numbers_lens(client, uri, timeout=120)
    assert "ran on this machine" in (lens.tooltip or ""), lens
    # The server never started a Ray of its own on this machine when its cluster went away.
    strays = ray_processes_of_the_server()
    assert not strays, strays


def ray_processes_of_the_server() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if MARK.encode() in environ and any(w in cmd for w in ("ray::", "raylet", "gcs_server", "ray/_private")):
            found.append(f"{pid} {cmd[:120]}")
            os.kill(int(pid), 9)  # ours (it carries this run's mark): never left behind
    return found
