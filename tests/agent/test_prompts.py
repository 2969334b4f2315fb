from kernel_lsp.agent.conversation import build_messages
from kernel_lsp.agent.prompts import describe_device
from kernel_lsp.agent.proposer import ProposalRequest
from kernel_lsp.model import Candidate, CompileResult, Evaluation, Task

from .fakes import timing

TASK = Task(name="t", reference_path="t.py", reference_source="class Model: REF_TEXT = 1\n")
CU = Candidate(source="__global__ void k() {}\nextern \"C\" int launch() { return 0; }\n", kind="cuda")


def test_optimize_prompt_has_everything_and_profile_only_when_given():
    ev = Evaluation(task="t", candidate=CU.id, verdict="correct", correct=True, time=timing(2.0),
                    eager=timing(3.0), compiled=timing(1.5))
    req = ProposalRequest(task=TASK, parent=CU, evaluation=ev, device={"name": "NVIDIA H200", "sm_count": 132},
                          history=["BLOCK 32 -> 64: correct, 1.40x vs start"],
                          profile={"hot_ops": [{"name": "k", "pct": 91.0}], "dram_throughput_pct": 88})
    system, user = build_messages(req)
    text = user["content"]
    for must in ("REF_TEXT", "NVIDIA H200", "132 SMs", "```cuda", "extern \"C\" int launch", "verdict: correct",
                 "time: 2.0000 ms", "torch.compile reference: 1.5000 ms", "BLOCK 32 -> 64", "Profiler facts",
                 "dram_throughput_pct", "Make it faster"):
        assert must in text, must
    assert "SEARCH/REPLACE" in system["content"] and 'extern "C"' in system["content"]
    req.profile = None
    assert "Profiler facts" not in build_messages(req)[1]["content"]


def test_repair_prompt_trims_a_huge_compile_log():
    log = "error: first\n" + "noise line\n" * 20000 + "error: last\n"
    ev = Evaluation(task="t", candidate=CU.id, verdict="compile_error", correct=False,
                    compile=CompileResult(ok=False, log=log))
    text = build_messages(ProposalRequest(task=TASK, parent=CU, evaluation=ev, mode="repair"))[1]["content"]
    assert "FAILS (compile_error)" in text and "error: first" in text and "error: last" in text
    assert "chars trimmed" in text and len(text) < 10000


def test_device_description_tolerates_unknown_fields():
    assert describe_device({}) == "GPU: unknown"
    assert "name: cpu" in describe_device({"name": "cpu", "cuda": False, "nested": {"x": 1}})


def test_resource_usage_only_once_correct():
    from kernel_lsp.model import ResourceUsage

    comp = CompileResult(ok=True, resources=[ResourceUsage(kernel="k", mangled="_Z1kv", arch="sm_90", registers=77)])
    wrong = Evaluation(task="t", candidate=CU.id, verdict="mismatch", correct=False, compile=comp)
    right = Evaluation(task="t", candidate=CU.id, verdict="correct", correct=True, compile=comp, time=timing(1.0))
    assert "77 registers" not in build_messages(ProposalRequest(task=TASK, parent=CU, evaluation=wrong, mode="repair"))[1]["content"]
    assert "77 registers" in build_messages(ProposalRequest(task=TASK, parent=CU, evaluation=right))[1]["content"]
