"""What the model receives, read from a recording OpenAI-compatible endpoint (real HTTP, the real
`openai` client): a lineage is a conversation, failures and unusable answers come back with
why, siblings get different directions, tools are offered and work, and the context holds
what a kernel engineer would give (GPU in units, baselines at every depth, the op's code).
The Search runs over the fake engine (tests/agent/fakes.py reads `# verdict:` / `# ms:` lines)."""

import json
import os

import pytest

import openai  # noqa: F401,E402  (a dependency of the project: missing is a failure, not a skip)

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.context import describe_device, describe_targets, op_source
from kernel_lsp.agent.conversation import compact
from kernel_lsp.agent.llm import LLMConfig, LLMProposer
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.agent.tree import Node, backup, near_key, ucb_pick
from kernel_lsp.model import Candidate, Evaluation, Task

from .fakes import FakeEngine, timing
from .openai_server import start

TASK = Task(name="fake", reference_path="fake.py", reference_source="class Model:\n    REFERENCE_MARKER = 1\n")
START = Candidate(source="import torch\nclass ModelNew:\n    pass\n# ms: 10\n# compiled: 4\n", kind="python")
H200 = {"name": "NVIDIA H200", "capability": [9, 0], "sm_count": 132, "memory_bytes": 150109880320,
        "l2_bytes": 62914560, "memory_bandwidth": 4.8e12, "bandwidth_source": "table",
        "max_sm_clock_mhz": 1980.0, "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "cuda_ok": True}


class H200Engine(FakeEngine):
    async def device_info(self):
        return dict(H200)


def fenced(note, body):
    return f"{note}\n```python\nimport torch\nclass ModelNew:\n    pass\n{body}\n```\n"


def llm(server, **kw):
    return LLMProposer(LLMConfig(model="gpt-4o-mini", base_url=server.base_url, api_key="sk-x",
                                 client_max_retries=0, backoff=0.01, **kw))


async def search(server, engine=None, budget=None, **opts):
    opts.setdefault("near_duplicates", False)  # the fake engine reads comments
    s = Search(engine or H200Engine(), None, TASK, START, llm(server, **opts.pop("llm", {})),
               SearchOptions(budget=budget or Budget(proposals=6, patience=3), confirm=False, **opts))
    result = await s.run()
    await s.proposer.aclose()
    return s, result


def user_texts(req):
    return [m["content"] for m in req["body"]["messages"] if m["role"] == "user"]


# -- the text protocol: a lineage is a conversation ------------------------------------------

async def test_lineage_repair_sees_its_own_answer_and_the_compiler_message_with_the_line():
    broken = fenced("Plan: fuse the loop.", "# verdict: compile_error\n# x")
    fixed = ("Plan: the missing semicolon.\n<<<<<<< SEARCH\n# verdict: compile_error\n=======\n# ms: 5\n"
             ">>>>>>> REPLACE\n")
    with start([broken, fixed], default="No more ideas.") as server:
        s, result = await search(server, children=1, budget=Budget(proposals=2))
    first, second = server.requests[0]["body"]["messages"], server.requests[1]["body"]["messages"]
    # Turn 1: the opening, with the start numbered and the GPU in units.
    opening = first[1]["content"]
    assert "  1| import torch" in opening and "132 SMs" in opening and "4800 GB/s" in opening
    # Turn 2 continues the same conversation: the opening, the model's own answer, its result.
    assert second[1] == first[1] and second[2] == {"role": "assistant", "content": broken}
    follow = second[3]["content"]
    assert second[3]["role"] == "user" and "verdict: compile_error" in follow
    # The compiler's line 4 is quoted beside its message, and the source is numbered.
    assert "line 4: error: expected ';'\n    4| # verdict: compile_error" in follow
    assert "  4| # verdict: compile_error" in follow and "FAILS (compile_error)" in follow
    # Children are timed without baselines: the start's torch.compile time is shown all the same.
    assert "torch.compile: 4.0000 ms" in follow or "under torch.compile: 4.0000 ms" in follow
    assert result.improved and "# ms: 5" in result.best.source


async def test_a_patch_that_does_not_apply_comes_back_whole_and_the_lineage_continues():
    bad = "Plan: tweak.\n<<<<<<< SEARCH\n    return nothing\n=======\n    return x\n>>>>>>> REPLACE\n"
    good = "Plan: tweak, copied right.\n<<<<<<< SEARCH\n# ms: 10\n=======\n# ms: 4\n>>>>>>> REPLACE\n"
    with start([bad, good]) as server:
        s, result = await search(server, children=1, budget=Budget(proposals=1))
    assert len(server.requests) == 2
    retry = server.requests[1]["body"]["messages"]
    assert retry[-2] == {"role": "assistant", "content": bad}
    text = retry[-1]["content"]
    assert "SEARCH text not found in the current source" in text
    assert "The patch block that failed, whole:\n```\n<<<<<<< SEARCH\n    return nothing\n=======" in text
    assert result.improved and "# ms: 4" in result.best.source
    child = s.nodes[result.best.id]
    assert [m["role"] for m in child.conversation] == ["user", "assistant", "user", "assistant"]
    assert any(st.get("sent_back") and "not found" in st["reason"] for st in s.steps)  # recorded, not dropped


async def test_a_correct_candidate_disqualified_by_a_flag_gets_a_repair_for_that_flag():
    with start([fenced("Plan: fp16 accumulation.", "# ms: 3\n# flags: less_accurate,not_counted"),
                "Plan: accumulate in fp32.\n<<<<<<< SEARCH\n# flags: less_accurate,not_counted\n=======\n"
                "# flags:\n>>>>>>> REPLACE\n"]) as server:
        s, result = await search(server, children=1, budget=Budget(proposals=2))
    repair = user_texts(server.requests[1])[-1]
    assert "correct and timed but does not count: flagged less_accurate" in repair
    assert "accumulate in fp32" in repair
    assert result.improved and result.best.parent is not None


async def test_siblings_get_different_directions_and_other_lineages_are_summarized():
    with start([fenced("a", "# ms: 8"), fenced("b", "# ms: 9"), fenced("c", "# ms: 7")]) as server:
        s, result = await search(server, children=2, budget=Budget(proposals=3))
    first_two = [user_texts(r)[-1] for r in server.requests[:2]]
    directions = [t.split("This answer's direction: ")[1].split(".\n")[0] for t in first_two]
    assert directions[0] != directions[1]
    for text, other in zip(first_two, reversed(directions)):
        assert "Other answers from this same source are exploring: " + other in text
    # The third request (a new expansion) names what the other lineage got.
    assert "Tried elsewhere in this search" in user_texts(server.requests[2])[-1]


async def test_near_duplicates_are_caught_beyond_byte_equality():
    cu = Candidate(source="__global__ void k(float* x) { x[0] = 1; }\n", kind="cuda")
    same = "// a comment\n__global__ void k(float* x)  {\n  x[0] = 1;   }\n"
    assert near_key(cu.source, "cuda") == near_key(same, "cuda")
    assert near_key("y = a // b\n", "python") != near_key("y = a // c\n", "python")
    assert near_key("x = 1  # one\n", "python") == near_key("x = 1\n", "python")
    # a `#define` inside a CUDA string of a Python file is code, not a comment
    cuda_256 = 'SRC = """\n#define THREADS 256\n"""\n'
    assert near_key(cuda_256, "python") != near_key(cuda_256.replace("256", "512"), "python")


def test_values_are_backed_up_and_steer_selection():
    root = Node(START, depth=0, parent=None)
    a = Node(Candidate(source="a", kind="python"), depth=1, parent=root.id, speedup=1.1)
    b = Node(Candidate(source="b", kind="python"), depth=1, parent=root.id, speedup=1.1)
    nodes = {n.id: n for n in (root, a, b)}
    for v in (3.0, 2.5):  # a's children were fast
        kid = Node(Candidate(source=f"a{v}", kind="python"), depth=2, parent=a.id)
        nodes[kid.id] = kid
        backup(nodes, kid, v)
    for v in (0.0, 0.0):  # b's children failed
        kid = Node(Candidate(source=f"b{v}{len(nodes)}", kind="python"), depth=2, parent=b.id)
        nodes[kid.id] = kid
        backup(nodes, kid, v)
    assert a.best_value == 3.0 and b.best_value == 0.0 and root.value_count == 4
    a.visits = b.visits = 2
    assert ucb_pick([a, b], 4, 0.3) is a


# -- tool calling -----------------------------------------------------------------------------

BROKEN_SRC = "import torch\nclass ModelNew:\n    pass\n# verdict: compile_error\n"


def _last_tool_result(body):
    return [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]


async def test_tool_calling_compile_sees_the_error_patches_tests_submits():
    def patch_after_error(body):
        seen = _last_tool_result(body)
        assert "line 4: error: expected ';'" in seen  # the model reads the compiler's line
        return {"tool_calls": [{"name": "compile", "arguments": {
            "patch": "<<<<<<< SEARCH\n# verdict: compile_error\n=======\n# ms: 2\n>>>>>>> REPLACE\n"}}]}

    script = [
        {"text": "Plan: a tiled kernel; compile first.", "tool_calls": [{"name": "compile", "arguments": {"source": BROKEN_SRC}}]},
        patch_after_error,
        {"tool_calls": [{"name": "test", "arguments": {}}, {"name": "read_reference", "arguments": {}}]},
        {"tool_calls": [{"name": "submit", "arguments": {"note": "tiled, 5x"}}]},
    ]
    with start(script) as server:
        s, result = await search(server, children=1, budget=Budget(proposals=1, evaluations=10))
    bodies = [r["body"] for r in server.requests]
    assert all(b.get("tools") for b in bodies)
    # read_op_source only where there is an op's source to read (an op Task of a whole model).
    assert {t["function"]["name"] for t in bodies[0]["tools"]} == {
        "compile", "test", "time", "profile", "read_reference", "submit"}
    assert "read_op_source" not in json.dumps(bodies[0]["tools"])
    assert "use the tools" in bodies[0]["messages"][0]["content"]
    opening = bodies[0]["messages"][1]["content"]  # the same context as the text protocol's
    for must in ("132 SMs", "  1| import torch", "Numbers to beat", "torch.compile: 4.0000 ms", "REFERENCE_MARKER"):
        assert must in opening, must
    assert "built" in _last_tool_result(bodies[2])
    tools3 = [m["content"] for m in bodies[3]["messages"] if m["role"] == "tool"]
    assert "verdict: correct" in tools3[-2] and "REFERENCE_MARKER" in tools3[-1]
    assert result.improved and "# ms: 2" in result.best.source and result.best.note == "tiled, 5x"
    # compile, compile, test: three evaluations the model asked for, plus the start and the submitted child.
    assert s.budget.used_evaluations == 5
    tools_steps = [st for st in s.steps if st["kind"] == "tool"]
    assert [st["checks"] for st in tools_steps] == [["compile"], ["compile"], ["compile", "verify"]]


async def test_tools_refused_by_the_endpoint_fall_back_to_the_text_protocol():
    with start([{"status": 400, "body": {"error": {"message": "tools are not supported by this model"}}},
                fenced("Plan: vectorize.", "# ms: 5")]) as server:
        s, result = await search(server, children=1, budget=Budget(proposals=1))
    bodies = [r["body"] for r in server.requests]
    assert "tools" in bodies[0] and "tools" not in bodies[1]
    assert "SEARCH/REPLACE patch blocks" in bodies[1]["messages"][0]["content"]
    assert result.improved


async def test_the_tool_budget_is_the_search_budget():
    calls = [{"tool_calls": [{"name": "compile", "arguments": {"source": BROKEN_SRC}}]}] * 3
    with start(calls + [{"tool_calls": [{"name": "submit", "arguments": {"note": "n", "source": BROKEN_SRC}}]}]) as server:
        s, result = await search(server, children=1, budget=Budget(proposals=1, evaluations=3))
    # The start and two compiles spend the 3 evaluations: the third compile is refused, with why.
    assert "evaluation budget is spent; submit your best version now" in _last_tool_result(server.requests[3]["body"])
    assert "line 4: error" in _last_tool_result(server.requests[2]["body"])
    assert len(server.requests) == 4 and any(n.candidate.note == "n" for n in s.nodes.values())
    assert "evaluation budget spent (4/3)" in result.reason  # the submitted one was still evaluated


# -- the context a kernel engineer would give --------------------------------------------------

def test_device_in_units_from_what_device_info_really_sets():
    text = describe_device(H200)
    for must in ("GPU: NVIDIA H200", "sm_90", "132 SMs, max SM clock 1980 MHz", "65536 32-bit registers",
                 "228 KiB shared memory", "227 KiB shared memory with the dynamic opt-in", "memory 140 GiB",
                 "DRAM bandwidth 4800 GB/s (from the table)", "L2 cache 60 MiB", "fp16 989 TFLOP/s",
                 "wgmma", "TMA", "fp32 (CUDA cores, FMA) 67 TFLOP/s", "tf32 (tensor cores) 495 TFLOP/s"):
        assert must in text, must
    assert "4800000000000" not in text and "python:" not in text


def test_floor_and_baselines_at_every_depth_degrade_gracefully():
    start_ev = Evaluation(task="t", candidate="s", verdict="correct", correct=True, time=timing(2.0),
                          eager=timing(3.0), compiled=timing(1.5))
    child = Evaluation(task="t", candidate="c", verdict="correct", correct=True, time=timing(1.0),
                       evidence={"speed_of_light": {"bytes_floor_ms": 0.25, "flop_floor_ms": None,
                                                    "fraction": 0.25, "label": "memory-bound"}})
    text = describe_targets(start_ev, child)
    assert "torch.compile: 1.5000 ms" in text and "eagerly: 3.0000 ms" in text and "current source: 1.0000" in text
    assert "moving the bytes once takes 0.2500 ms" in text and "reaches 25% of it (memory-bound)" in text
    child.evidence = {}
    assert "hardware floor" not in describe_targets(start_ev, child)


def test_op_task_prompt_holds_the_ops_own_class_and_helpers(tmp_path):
    from kernel_lsp.agent.op_tasks import op_task_source

    model = tmp_path / "net.py"
    model.write_text("import torch\nimport torch.nn as nn\n\n\ndef _gelu(x):\n    return 0.5 * x * (1 + torch.tanh(x))\n\n\n"
                     "class TanhGelu(nn.Module):\n    def forward(self, x):\n        return _gelu(x) * 2\n\n\n"
                     "class Model(nn.Module):\n    pass\n")
    op = {"name": "act", "share": 0.6, "calls": 1, "class": {"name": "TanhGelu", "where": "model_file", "module": "net"},
          "init": {"args": []}, "call": {"args": [{"kind": "tensor", "shape": [4, 8], "dtype": "torch.float32"}],
                                         "kwargs": {}}}
    task_path = tmp_path / ".kernel-lsp" / "ops" / "net_act.py"
    task_path.parent.mkdir(parents=True)
    src = op_task_source(op, str(model), str(task_path), {"time": "cuda", "device_name": "H200"})
    assert "_original().TanhGelu(" in src
    task = Task(name="net_act", reference_path=str(task_path), reference_source=src)
    text = op_source(task)
    assert "class TanhGelu(nn.Module)" in text and "def _gelu(x)" in text and "class Model" not in text
    assert "net.py, lines 5-6" in text


async def test_op_source_reaches_the_model(tmp_path):
    global TASK
    model = tmp_path / "net.py"
    model.write_text("class Op:\n    OP_MARKER = 1\n")
    saved = TASK
    TASK = Task(name="net_op", reference_path=str(tmp_path / "t.py"), reference_source=(
        "SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'net.py')\n"
        "class Model:\n    def __init__(self):\n        self.op = _original().Op()\n"))
    try:
        with start([{"tool_calls": [{"name": "read_op_source", "arguments": {}}]},
                    fenced("p", "# ms: 5")]) as server:
            await search(server, children=1, budget=Budget(proposals=1))
    finally:
        TASK = saved
    assert "The op's own code" in user_texts(server.requests[0])[0]
    assert "OP_MARKER" in user_texts(server.requests[0])[0]
    # An op Task offers read_op_source, and calling it reads the op's class from the user's file.
    names = {t["function"]["name"] for t in server.requests[0]["body"]["tools"]}
    assert "read_op_source" in names and "read_reference" in names
    tool_answers = [m["content"] for m in server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert "class Op:" in tool_answers[-1] and "OP_MARKER" in tool_answers[-1]


def test_read_op_source_is_refused_where_it_is_not_offered():
    """A model that calls a tool it was not offered (read_op_source on a plain Task) is told which
    tools there are; nothing is read."""
    import asyncio

    from kernel_lsp.agent.tools import Toolbox, tool_specs

    async def never(*a):
        raise AssertionError("no evaluation for a read")

    box = Toolbox(task=TASK, evaluate=never, profile=None, budget=Budget(), specs=tool_specs(TASK))
    answer = asyncio.run(box.session(START).call("read_op_source", "{}"))
    assert answer.startswith("error: the tool 'read_op_source' is not offered for this Task")
    assert "read_reference" in answer and "submit" in answer


def test_compaction_says_what_it_left_out_and_keeps_the_reference_and_the_last_turn():
    ref = "```python\nclass Model:\n" + "    x = 1\n" * 200 + "```"
    code = "```python\n" + "\n".join(f"{i:>4}| line" for i in range(1, 400)) + "\n```"
    turns = [{"role": "user", "content": "Reference:\n" + ref + "\nCurrent source:\n" + code}]
    for i in range(6):
        turns += [{"role": "assistant", "content": "plan\n```python\n" + "y = 2\n" * 400 + "```"},
                  {"role": "user", "content": "result\n" + code}]
    out = compact(turns, limit=20_000)
    assert len(out) == len(turns)  # no turn dropped
    assert ref in out[0]["content"] and out[-1] == turns[-1]
    assert "[compacted: 400 lines of code from turn 2" in out[1]["content"]
    assert sum(len(m["content"]) for m in out) <= 20_000 < sum(len(m["content"]) for m in turns)


async def test_recorded_request_reads_right(tmp_path):
    """One whole request as the model reads it: recorded for docs/agent.md (KLSP_RECORD=path)."""
    with start([fenced("Plan: one pass.", "# verdict: mismatch"), fenced("Plan: fix the index.", "# ms: 4")]) as server:
        await search(server, children=1, budget=Budget(proposals=2))
    body = server.requests[1]["body"]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    text = "\n".join(m["content"] for m in body["messages"])
    assert "n/a" not in text.split("Numbers to beat")[1].split("\n\n")[0]  # baselines carried
    assert "None" not in text and "{" not in body["messages"][1]["content"].split("Reference")[0]
    if os.environ.get("KLSP_RECORD"):
        with open(os.environ["KLSP_RECORD"], "w") as f:
            json.dump(body, f, indent=1)


def test_library_bound_ops_are_recognized():
    from kernel_lsp.agent.whole_model import OpResult, library_bound

    def op(cls, where):
        return OpResult(name="x", cls=cls, share=0.5, calls=1, shapes=[], record={"class": {"name": cls, "where": where}})

    assert library_bound(op("Linear", "torch.nn")) and library_bound(op("Conv2d", "torch.nn"))
    assert not library_bound(op("Linear", "model_file"))  # the user's own class: its code is searched
    assert not library_bound(op("GELU", "torch.nn"))


def test_compaction_of_tool_call_arguments():
    big = "x = 1\n" * 300
    turns = [{"role": "user", "content": "opening"}]
    for i in range(8):
        turns += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "compile", "arguments": json.dumps({"source": big})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "built"}]
    turns.append({"role": "user", "content": "last"})
    out = compact(turns, limit=5000)
    args = json.loads(out[1]["tool_calls"][0]["function"]["arguments"])
    assert args["source"].startswith("[compacted: 301 lines of source from turn 2")
    assert [m["role"] for m in out] == [m["role"] for m in turns] and out[-1] == turns[-1]


def test_toolchain_versions_come_from_the_workers_evaluation():
    from kernel_lsp.agent.context import describe_toolchain

    text = describe_toolchain({"cuda": True, "torch": "2.11.0+cu130", "triton": "3.6.0"}, cutlass=None)
    assert "PyTorch 2.11.0+cu130" in text and "Triton 3.6.0" in text and "True" not in text
    assert "no CUTLASS/CuTe headers" in text


async def test_an_op_search_hands_what_it_did_not_use_to_the_next(tmp_path):
    from kernel_lsp.agent.whole_model import OpResult, WholeModelOptions, _run_searches

    from .test_search_policy import Scripted

    ref = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
           "        return x\n\n\ndef get_inputs():\n    return [torch.randn(4)]\n\n\ndef get_init_inputs():\n    return []\n")
    ops = []
    for name, budget in (("a", 3), ("b", 2)):
        path = tmp_path / f"m_{name}.py"
        path.write_text(ref)
        ops.append(OpResult(name=name, cls="X", share=0.5, calls=1, shapes=[], task=str(path), budget=budget))
    proposers = {"a": Scripted([]), "b": Scripted([["# ms: 5"], ["# ms: 4"], ["# ms: 3"], ["# ms: 2"], ["# ms: 1"]])}
    events = []
    opts = WholeModelOptions(patience=None, search=SearchOptions(children=1, confirm=False, near_duplicates=False))
    await _run_searches(ops, [H200Engine()], None, lambda op: proposers[op.name], opts, events.append)
    # "a" had nothing to propose: its 3 proposals went to "b", which used all 5.
    assert "b: searching (5 proposals, 3 handed on by earlier ops" in "\n".join(events)
    assert ops[1].search.usage["proposals"] == 5 and ops[0].budget == 3 and ops[1].budget == 2


def test_a_tool_that_does_not_exist_changes_nothing():
    """A call to a made-up tool with a whole new source is refused with the tool list, and the
    working source stays what it was (the source argument is not applied)."""
    import asyncio

    from kernel_lsp.agent.tools import Toolbox, tool_specs

    async def never(*a):
        raise AssertionError("no evaluation for an unknown tool")

    box = Toolbox(task=TASK, evaluate=never, profile=None, budget=Budget(), specs=tool_specs(TASK))
    session = box.session(START)
    answer = asyncio.run(session.call("benchmark_it", {"source": "class ModelNew:\n    pass\n"}))
    assert answer.startswith("error: no tool named 'benchmark_it'; the tools are ")
    assert "submit" in answer
    assert session.working == START.source
    assert box.budget.used_evaluations == 0
