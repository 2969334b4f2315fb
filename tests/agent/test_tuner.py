import pytest

from kernel_lsp.agent.proposer import ProposalRequest
from kernel_lsp.agent.tuner import TunerProposer, compile_variants, find_tunables, variants
from kernel_lsp.model import Candidate, Task

CU = """#define BLOCK_SIZE 256
constexpr int TILE = 16;
template <int VEC = 4>
__global__ void __launch_bounds__(256) k(float* x) {
  #pragma unroll 4
  for (int i = 0; i < 4; ++i) {}
}
extern "C" void launch(float* x, int n) {
  dim3 block(16, 16);
  k<<<(n + 127) / 128, 128>>>(x);
  k<<<n / BLOCK_SIZE, BLOCK_SIZE>>>(x);
}
"""


def test_finds_each_form():
    found = {(t.kind, t.name, t.value) for t in find_tunables(CU)}
    assert found == {("define", "BLOCK_SIZE", 256), ("constexpr", "TILE", 16), ("template", "VEC", 4),
                     ("launch_bounds", "__launch_bounds__", 256),
                     ("unroll", "#pragma unroll (line 5)", 4), ("dim3", "block.x", 16),
                     ("dim3", "block.y", 16), ("launch", "launch block size", 128)}


def test_block_sizes_stay_legal():
    for src, note in variants(CU):
        for t in find_tunables(src):
            if t.kind in ("launch", "launch_bounds") or t.name == "BLOCK_SIZE":
                assert 32 <= t.value <= 1024 and t.value % 32 == 0, note
        bx = [t.value for t in find_tunables(src) if t.kind == "dim3"]
        assert bx[0] * bx[1] <= 1024, note


def test_block_size_moves_launch_bounds_with_it():
    new = dict((n, s) for s, n in variants(CU))["BLOCK_SIZE 256 -> 512"]
    assert "#define BLOCK_SIZE 512" in new and "__launch_bounds__(512)" in new
    # Lowering the bound alone would break a 256-thread launch: never proposed.
    assert "__launch_bounds__ 256 -> 128" not in dict((n, s) for s, n in variants(CU))


def test_notes_and_neighbours():
    notes = [n for _, n in variants(CU)]
    assert "BLOCK_SIZE 256 -> 64" in notes and "TILE 16 -> 32" in notes
    assert "launch block size 128 -> 32" in notes
    assert not any("-> 2048" in n for n in notes)


def test_python_constants_and_compile_modes():
    src = "import torch\nCHUNK = 1\nclass ModelNew(torch.nn.Module):\n    pass\n"
    assert [n for _, n in variants(src, "python")] == ["CHUNK 1 -> 2", "CHUNK 1 -> 4"]
    modes = [n for _, n in compile_variants(src)]
    assert "torch.compile(mode='reduce-overhead') (CUDA graphs)" in modes
    assert [n for _, n in compile_variants(src, ("default",))] == ["torch.compile(mode='default')"]


def test_precheck_says_at_once_when_there_is_nothing_to_vary():
    tuner = TunerProposer()
    plain_cu = Candidate(source="__global__ void k(float* x) { x[threadIdx.x] = 0; }\n", kind="cuda")
    why = tuner.precheck(plain_cu, {"name": "cpu"})
    assert why and "nothing to vary" in why and "needs an LLM" in why and "KERNEL_LSP_MODEL" in why
    assert tuner.precheck(Candidate(source=CU, kind="cuda"), {"name": "cpu"}) is None
    module = Candidate(source="import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", kind="python")
    assert tuner.precheck(module, {"name": "cpu"}) is None        # torch.compile may help
    compiled = Candidate(source=module.source + "ModelNew = torch.compile(ModelNew)\n", kind="python")
    assert "torch.compile needs a ModelNew without it" in tuner.precheck(compiled, {"name": "cpu"})


async def test_cpu_offers_torch_compile_only_when_its_baseline_won():
    from kernel_lsp.model import Evaluation, Timing

    task = Task(name="t", reference_path="t.py", reference_source="")
    start = Candidate(source="import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", kind="python")

    def ev(compiled_ms):
        t = lambda ms: Timing(median_ms=ms, min_ms=ms, max_ms=ms, spread_pct=1.0, runs=20)  # noqa: E731
        return Evaluation(task="t", candidate=start.id, verdict="correct", correct=True, time=t(10.0),
                          eager=t(10.0), compiled=t(compiled_ms))

    req = lambda e: ProposalRequest(task=task, parent=start, evaluation=e, device={"name": "cpu"},  # noqa: E731
                                    count=4, start_evaluation=e)
    [p] = await TunerProposer().propose(req(ev(2.0)))
    assert p.candidate is not None and p.candidate.note == "torch.compile(mode='default')"
    [p] = await TunerProposer().propose(req(ev(20.0)))
    assert p.candidate is None and p.fatal and "torch.compile was not faster" in p.error
    assert "needs an LLM" in p.error


async def test_proposer_hands_out_each_variant_once():
    task = Task(name="t", reference_path="t.py", reference_source="")
    parent = Candidate(source=CU, kind="cuda")
    tuner = TunerProposer()
    seen = []
    while True:
        got = await tuner.propose(ProposalRequest(task=task, parent=parent, evaluation=None, count=5))
        if not got:
            break
        assert all(p.candidate and p.candidate.parent == parent.id and p.candidate.origin == "tuner" for p in got)
        seen += [p.candidate.id for p in got]
    assert len(seen) == len(set(seen)) == len(variants(CU))
    assert tuner.exhausted(parent)


async def test_tuner_refuses_repair_and_skips_compile_on_cpu():
    task = Task(name="t", reference_path="t.py", reference_source="")
    parent = Candidate(source="import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", kind="python")
    tuner = TunerProposer()
    [p] = await tuner.propose(ProposalRequest(task=task, parent=parent, evaluation=None, mode="repair"))
    assert p.candidate is None and "cannot repair" in p.error
    assert await tuner.propose(ProposalRequest(task=task, parent=parent, evaluation=None,
                                               device={"name": "cpu"}, count=9)) == []  # not the start
    got = await TunerProposer().propose(ProposalRequest(task=task, parent=parent, evaluation=None,
                                                        device={"name": "NVIDIA H200"}, count=9))
    assert len(got) == 3


def test_relations_through_expressions():
    # TILE sets a TILE x TILE block through __launch_bounds__(TILE * TILE): 64 would be 4096 threads.
    src = ("#define TILE 32\n__global__ void __launch_bounds__(TILE * TILE) k() {}\n"
           "void f() { dim3 block(TILE, TILE); k<<<g, block>>>(); }\n")
    assert [n for _, n in variants(src)] == ["TILE 32 -> 16", "TILE 32 -> 8"]
    # ITEMS_PER_THREAD is not a thread count; THREADS_PER_BLOCK is.
    src = "#define ITEMS_PER_THREAD 1\n#define THREADS_PER_BLOCK 32\n"
    assert [n for _, n in variants(src)] == ["ITEMS_PER_THREAD 1 -> 2", "ITEMS_PER_THREAD 1 -> 4",
                                             "THREADS_PER_BLOCK 32 -> 64", "THREADS_PER_BLOCK 32 -> 128"]


@pytest.mark.parametrize("name, expected", [
    ("softmax", {"BLOCK_SIZE 32 -> 64", "BLOCK_SIZE 32 -> 128"}),
    ("matmul", {"TILE 8 -> 16", "TILE 8 -> 32", "TILE 8 -> 4", "TILE 8 -> 2"}),
    ("bias_gelu", {"BLOCK_SIZE 32 -> 64", "BLOCK_SIZE 32 -> 128", "ITEMS_PER_THREAD 1 -> 2",
                   "ITEMS_PER_THREAD 1 -> 4"}),
])
def test_examples_tunables(name, expected):
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / f"{name}.cu"
    assert path.exists(), f"{path} is missing: the tuner's example"
    assert {n for _, n in variants(path.read_text())} == expected


async def test_never_proposes_the_parent_or_the_start_again():
    from kernel_lsp.model import Evaluation

    task = Task(name="t", reference_path="t.py", reference_source="")
    start = Candidate(source="CHUNK = 1\nclass ModelNew: pass\n", kind="python")
    child = Candidate(source="CHUNK = 4\nclass ModelNew: pass\n", kind="python")
    tuner = TunerProposer()
    got = await tuner.propose(ProposalRequest(task=task, parent=child, evaluation=None, count=9,
                                              start_evaluation=Evaluation(task="t", candidate=start.id)))
    assert [p.candidate.note for p in got] == ["CHUNK 4 -> 8", "CHUNK 4 -> 2", "CHUNK 4 -> 16"]
