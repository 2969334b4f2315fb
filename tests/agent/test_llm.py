"""The LLM proposer through the real `openai` client against a real local HTTP server."""

import logging

import pytest

import openai  # noqa: F401,E402  (a dependency of the project: missing is a failure, not a skip)

from kernel_lsp.agent.budget import Pricing
from kernel_lsp.agent.llm import LLMConfig, LLMProposer
from kernel_lsp.agent.proposer import ProposalRequest
from kernel_lsp.model import Candidate, CompileResult, Diagnostic, Evaluation, Span, Task

from .openai_server import start

SECRET = "sk-test-SECRET-4242"
TASK = Task(name="rowsum", reference_path="rowsum.py",
            reference_source="class Model:\n    REFERENCE_MARKER = 1\n")
PARENT = Candidate(source="import torch\nclass ModelNew:\n    def forward(self, x):\n        return x.sum(1)\n",
                   kind="python")
FAILED = Evaluation(task="rowsum", candidate=PARENT.id, verdict="compile_error", correct=None,
                    message="did not build",
                    compile=CompileResult(ok=False, log="rowsum.cu(3): error: identifier \"blockDimx\" is undefined",
                                          diagnostics=[Diagnostic(Span(2, 0, 2, 4), "error",
                                                                  'identifier "blockDimx" is undefined')]))
PATCH = ("Fixed the typo.\n<<<<<<< SEARCH\n        return x.sum(1)\n=======\n"
         "        return x.sum(dim=1)\n>>>>>>> REPLACE\n")


@pytest.fixture
def server():
    s = start([])
    yield s
    s.close()


def proposer(server, **kw):
    sleeps = []

    async def sleep(s):
        sleeps.append(s)

    cfg = LLMConfig(model=kw.pop("model", "gpt-4o-mini"), base_url=kw.pop("base_url", server.base_url),
                    api_key=SECRET, client_max_retries=kw.pop("client_max_retries", 0), backoff=0.01, **kw)
    p = LLMProposer(cfg, sleep=sleep)
    p.sleeps = sleeps
    return p


def request(mode="repair", **kw):
    return ProposalRequest(task=TASK, parent=PARENT, evaluation=FAILED, mode=mode,
                           device={"name": "NVIDIA H200", "sm_count": 132, "capability": "9.0",
                                   "memory_bandwidth_gbps": 4800},
                           history=["BLOCK 128 -> 256: mismatch"], **kw)


async def test_repair_by_patch_streamed_with_usage(server):
    server.add(PATCH)
    p = proposer(server, model="gpt-4o")
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.error is None and prop.form == "patch"
    c = prop.candidate
    assert "x.sum(dim=1)" in c.source and c.parent == PARENT.id and c.origin == "repair"
    assert c.note.startswith("Fixed the typo.")
    body = server.requests[0]["body"]
    assert body["stream"] is True and body["model"] == "gpt-4o"
    prompt = body["messages"][1]["content"]
    for must in ("REFERENCE_MARKER", "NVIDIA H200", "132 SMs", "x.sum(1)", "blockDimx",
                 "BLOCK 128 -> 256", "FAILS (compile_error)"):
        assert must in prompt
    assert prop.prompt_tokens > 0 and prop.completion_tokens == len(PATCH) // 4
    assert prop.cost == pytest.approx(Pricing().cost("gpt-4o", prop.prompt_tokens, prop.completion_tokens))
    assert prop.cost > 0


async def test_non_streaming_and_unknown_model_costs_nothing(server):
    server.add("```python\nimport torch\nclass ModelNew:\n    pass\n```")
    p = proposer(server, model="my-local-llama", stream=False)
    [prop] = await p.propose(request(mode="optimize"))
    await p.aclose()
    assert prop.candidate is not None and prop.form == "file" and prop.candidate.origin == "llm"
    assert prop.cost == 0.0 and prop.prompt_tokens > 0
    assert "Make it faster" in server.requests[0]["body"]["messages"][1]["content"]


async def test_429_then_success_honours_retry_after(server):
    server.add({"status": 429, "headers": {"Retry-After": "0.25"}}, PATCH)
    p = proposer(server)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is not None
    assert p.sleeps == [0.25] and len(server.requests) == 2


async def test_client_retries_first(server):
    server.add({"status": 503, "headers": {"Retry-After": "0"}}, PATCH)
    p = proposer(server, client_max_retries=1)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is not None and p.sleeps == []  # the openai client's own retry did it


async def test_persistent_500_is_a_failed_proposal(server):
    server.add(*[{"status": 500}] * 3)
    p = proposer(server, attempts=3)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is None and not prop.fatal
    assert "server error (HTTP 500)" in prop.error and "after 3 attempts" in prop.error
    assert len(p.sleeps) == 2


async def test_stream_error_event_is_retried(server):
    server.add({"stream_error": "overloaded"}, PATCH)
    p = proposer(server)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is not None and len(server.requests) == 2


async def test_wrong_key_is_fatal_and_clear(server):
    server.add({"status": 401, "body": {"error": {"message": "Incorrect API key", "type": "invalid_request_error"}}})
    p = proposer(server)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.fatal and "authentication failed (HTTP 401)" in prop.error
    assert len(server.requests) == 1  # not retried


async def test_endpoint_down(server):
    import time

    from kernel_lsp.verdicts import CannotRun, EndpointUnreachable

    port = server.port
    server.close()
    p = proposer(server, base_url=f"http://127.0.0.1:{port}/v1", attempts=3)
    t0 = time.monotonic()
    with pytest.raises(EndpointUnreachable) as info:
        await p.check()
    assert isinstance(info.value, CannotRun) and f"127.0.0.1:{port}" in info.value.reason
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is None and prop.fatal and "cannot reach the endpoint" in prop.error
    assert prop.error.startswith("endpoint unreachable") and p.sleeps == []  # no retry loop
    assert time.monotonic() - t0 < 5.0


async def test_check_passes_for_a_live_endpoint(server):
    p = proposer(server)
    await p.check()  # GET /models answered
    await p.aclose()
    # The check asked the configured endpoint for its model list, with the key, once; no chat.
    assert [g["path"] for g in server.gets] == ["/v1/models"]
    assert server.gets[0]["headers"]["authorization"] == f"Bearer {SECRET}" and server.requests == []


def test_no_model_configured_is_an_immediate_clear_error():
    from kernel_lsp.verdicts import CannotRun, NoModelConfigured

    cfg = LLMConfig.from_env(env={})
    assert cfg.model is None  # never a default model
    with pytest.raises(NoModelConfigured) as info:
        LLMProposer(cfg)
    assert isinstance(info.value, CannotRun) and "KERNEL_LSP_MODEL" in info.value.reason
    # A model but no endpoint and no key: not the public endpoint with a placeholder key.
    with pytest.raises(NoModelConfigured) as info:
        LLMProposer(LLMConfig.from_env(env={"KERNEL_LSP_MODEL": "m1"}))
    assert "OPENAI_BASE_URL" in info.value.reason


async def test_request_timeout(server):
    server.add({"sleep": 1.5, "text": PATCH})
    p = proposer(server, request_timeout=0.3, attempts=1)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is None and "timed out" in prop.error


@pytest.mark.parametrize("answer, reason", [
    ("Use shared memory and vectorized loads; it will be faster.", "prose only"),
    ("", "empty answer"),
    ("```python\n" + "# pad\n" * 40000 + "class ModelNew: pass\n```", "too long"),
    ("<<<<<<< SEARCH\n    return y\n=======\n    return z\n>>>>>>> REPLACE", "not found"),
])
async def test_bad_answers_are_failed_proposals_with_usage(server, answer, reason):
    server.add(answer, answer, answer)
    p = proposer(server)  # parse_retries 2: the answer goes back to the model twice, with why
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is None and not prop.fatal
    assert prop.error.startswith("unusable answer") and reason in prop.error
    assert prop.prompt_tokens > 0  # tokens were spent all the same
    assert len(server.requests) == 3 and prop.turns == 3
    last = server.requests[-1]["body"]["messages"]
    assert last[-1]["role"] == "user" and "could not be used" in last[-1]["content"]
    assert reason in last[-1]["content"] and last[-2] == {"role": "assistant", "content": answer}


async def test_several_children_in_parallel(server):
    server.add("```python\nclass ModelNew: a = 1\n```", "```python\nclass ModelNew: a = 2\n```")
    p = proposer(server)
    props = await p.propose(request(mode="optimize", count=2))
    await p.aclose()
    assert sorted(pr.candidate.source for pr in props) == ["class ModelNew: a = 1\n", "class ModelNew: a = 2\n"]


async def test_key_never_logged_or_exposed(server, caplog):
    caplog.set_level(logging.DEBUG)
    server.add({"status": 401}, {"status": 429, "headers": {"Retry-After": "0"}}, PATCH)
    p = proposer(server)
    props = [*(await p.propose(request())), *(await p.propose(request()))]
    await p.aclose()
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in caplog.text
    assert SECRET not in repr(p.config) and SECRET not in str(p.config.describe())
    assert all(SECRET not in repr(pr) for pr in props)
    assert all(SECRET not in m["content"] for r in server.requests for m in r["body"]["messages"])


def test_config_from_env():
    cfg = LLMConfig.from_env(env={"OPENAI_API_KEY": "k1", "OPENAI_BASE_URL": "http://x/v1",
                                  "KERNEL_LSP_MODEL": "m1"})
    assert (cfg.api_key, cfg.base_url, cfg.model) == ("k1", "http://x/v1", "m1")
    assert LLMConfig.from_env(model="m2", env={"KERNEL_LSP_MODEL": "m1"}).model == "m2"
    assert "k1" not in repr(cfg)


def test_pricing_prefix_and_override():
    p = Pricing()
    assert p.lookup("gpt-4o-mini-2024-07-18") == (0.15, 0.60)
    assert p.lookup("openai/gpt-4o") == (2.50, 10.00)
    assert p.cost("qwen2.5-coder:7b", 10**6, 10**6) == 0.0
    assert Pricing(table={"local": (1.0, 2.0)}).cost("local-x", 10**6, 10**6) == 3.0


async def test_refused_parameters_are_adapted(server):
    # A reasoning model's answer to max_tokens, then a local server refusing stream_options.
    server.add({"status": 400, "body": {"error": {"message": "Unsupported parameter: 'max_tokens' is not "
                                                              "supported with this model. Use 'max_completion_tokens'."}}},
               {"status": 400, "body": {"error": {"message": "Unknown field stream_options"}}},
               PATCH)
    p = proposer(server, attempts=1)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is not None
    bodies = [r["body"] for r in server.requests]
    assert "max_tokens" in bodies[0] and "max_completion_tokens" in bodies[1] and "max_tokens" not in bodies[1]
    assert "stream_options" in bodies[1] and "stream_options" not in bodies[2]
    assert prop.completion_tokens == len(PATCH) // 4  # estimated without usage: about 4 chars a token


async def test_other_400_is_a_clear_failure(server):
    server.add({"status": 400, "body": {"error": {"message": "invalid value for messages[1].role"}}})
    p = proposer(server)
    [prop] = await p.propose(request())
    await p.aclose()
    assert prop.candidate is None and not prop.fatal and "request rejected (HTTP 400)" in prop.error
    assert len(server.requests) == 1


async def test_cancel_while_the_model_is_answering(server, tmp_path):
    import asyncio
    import time

    from kernel_lsp.agent.search import Search, SearchOptions
    from kernel_lsp.store import Store

    from .fakes import FakeEngine

    server.add({"sleep": 5.0, "text": PATCH})
    store = Store(tmp_path / "s.sqlite")
    start = Candidate(source=PARENT.source + "# ms: 10\n", kind="python")
    search = Search(FakeEngine(), store, TASK, start, proposer(server), SearchOptions(children=1))
    job = asyncio.create_task(search.run())
    while not server.requests:
        await asyncio.sleep(0.05)
    t0 = time.monotonic()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert time.monotonic() - t0 < 1.0
    await search.proposer.aclose()
    row = store.search(search.search_id)
    assert row["state"] == "cancelled" and [n["candidate"] for n in row["nodes"]] == [start.id]
    assert store.latest(TASK.name).candidate == start.id  # the start's evaluation is kept


async def test_a_small_context_gets_fewer_answer_tokens_and_reasoning_models_more(server):
    server.add({"status": 400, "body": {"error": {"message": "This model's maximum context length is 8192 tokens."}}},
               PATCH,
               {"status": 400, "body": {"error": {"message": "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens'."}}},
               PATCH)
    p = proposer(server, attempts=1)
    [first] = await p.propose(request())
    assert first.candidate is not None
    bodies = [r["body"] for r in server.requests]
    assert bodies[0]["max_tokens"] == 16384 and bodies[1]["max_tokens"] == 8192
    [second] = await p.propose(request())
    await p.aclose()
    assert server.requests[3]["body"]["max_completion_tokens"] == 8192  # the cap holds for reasoning too
    p2 = proposer(server, attempts=1)
    server.add({"status": 400, "body": {"error": {"message": "Unsupported parameter: 'max_tokens'."}}}, PATCH)
    await p2.propose(request())
    await p2.aclose()
    assert server.requests[-1]["body"]["max_completion_tokens"] == 65536  # hidden reasoning counts
