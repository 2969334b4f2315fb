"""The no-LLM tuner's candidates on recorded Inductor output: the launch-config sweep and the
Proposer's rounds (the Worker's recording replayed from tests/data/inductor)."""

from __future__ import annotations

import asyncio
import ast
import json

import pytest

from kernel_lsp.agent.proposer import ProposalRequest
from kernel_lsp.model import Candidate, Task
from kernel_lsp.nollm import graphs, sweep
from kernel_lsp.nollm.proposer import InductorProposer, convert_recording, is_module_start
from kernel_lsp.nollm.writer import write_model_new

from .fixtures import DATA, load, recordings


def _generated(task: str, module: str = "default_0.py") -> str:
    ref, code, args = load(task, module)
    return write_model_new(ref, code, args).source


@pytest.mark.parametrize("task,module", recordings())
def test_every_variant_changes_one_kernel_one_or_two_parameters_and_stays_launchable(task, module):
    src = _generated(task, module)
    base = sweep.configs(src)
    seen = set()
    sizes = []
    for new, note in sweep.variants(src):
        ast.parse(new)
        assert new not in seen
        seen.add(new)
        cfgs = sweep.configs(new)
        changed = [(k, p) for k in base for p in base[k] if cfgs[k][p] != base[k][p]]
        assert len(changed) in (1, 2) and len({k for k, _ in changed}) == 1, note
        kernel = changed[0][0]
        assert note == f"{kernel}: " + ", ".join(f"{p} {base[kernel][p]} -> {cfgs[kernel][p]}" for _, p in changed)
        assert sweep.config_ok(sweep.kernel_facts(new, kernel), cfgs[kernel])
        if len(changed) == 2:  # a paired move: the tile reshaped, or a block with its warps
            (_, a), (_, b) = changed
            old, now = base[kernel], cfgs[kernel]
            if b == "num_warps":
                assert (now[a] > old[a]) == (now[b] > old[b])
            else:
                assert now[a] * now[b] == old[a] * old[b]
        sizes.append(len(changed))
    assert sizes == sorted(sizes)  # every one-parameter move before any paired one
    if base:
        assert seen, f"{task}: nothing to sweep"


def test_paired_moves_reach_what_one_step_cannot():
    """softmax's looped reduction (x 4096 rows, r0_ 4096, recorded at XBLOCK 1, R0_BLOCK 2048,
    8 warps): the tile reshaped at the same size, and each block with its warps; a block of 0, or
    more elements per program than the bound, is no move."""
    src = _generated("softmax")
    name = "triton_red_fused__softmax_exp_prepare_softmax_online_sub_0"
    cfg = sweep.configs(src)[name]
    facts = sweep.kernel_facts(src, name)
    assert cfg == {"XBLOCK": 1, "R0_BLOCK": 2048, "num_warps": 8, "num_stages": 1}
    assert [note for _, note in sweep.paired(facts, cfg)] == [
        "XBLOCK 1 -> 2, R0_BLOCK 2048 -> 1024",   # (XBLOCK 0 is no block)
        "XBLOCK 1 -> 2, num_warps 8 -> 16",
        "R0_BLOCK 2048 -> 4096, num_warps 8 -> 16",
        "R0_BLOCK 2048 -> 1024, num_warps 8 -> 4"]
    # At 16 warps (the most) only the halving moves with warps are left; at 8 x 2048 elements a
    # doubled block would pass the bound.
    wide = {"XBLOCK": 8, "R0_BLOCK": 2048, "num_warps": 16, "num_stages": 1}
    assert [note for _, note in sweep.paired(facts, wide)] == [
        "XBLOCK 8 -> 16, R0_BLOCK 2048 -> 1024", "XBLOCK 8 -> 4, R0_BLOCK 2048 -> 4096",
        "XBLOCK 8 -> 4, num_warps 16 -> 8", "R0_BLOCK 2048 -> 1024, num_warps 16 -> 8"]


def test_unmasked_blocks_divide_the_numel():
    src = _generated("bias_gelu")  # xnumel 25165824 = 3 * 2**23, no bounds mask
    facts = sweep.kernel_facts(src, "triton_poi_fused_add_gelu_0")
    assert facts.numels == {"x": 25165824} and facts.unmasked == {"x"}
    notes = [n for _, n in sweep.variants(src)]
    assert "triton_poi_fused_add_gelu_0: XBLOCK 1024 -> 2048" in notes
    assert "triton_poi_fused_add_gelu_0: XBLOCK 1024 -> 512" in notes
    assert "triton_poi_fused_add_gelu_0: num_warps 4 -> 8" in notes
    assert "triton_poi_fused_add_gelu_0: num_stages 1 -> 2" in notes
    assert not sweep.config_ok(facts, {"XBLOCK": 3, "num_warps": 4, "num_stages": 1})
    assert not sweep.config_ok(facts, {"XBLOCK": 8192, "num_warps": 4, "num_stages": 1})  # past MAX_BLOCK


def test_reductions_keep_their_elements_per_program_bounded():
    src = _generated("softmax")
    name = "triton_red_fused__softmax_exp_prepare_softmax_online_sub_0"
    facts = sweep.kernel_facts(src, name)
    assert facts.numels == {"x": 4096, "r0_": 4096}
    for new, _ in sweep.variants(src):
        cfg = sweep.configs(new)[name]
        assert cfg["XBLOCK"] * cfg["R0_BLOCK"] <= sweep.MAX_ELEMENTS
    # A persistent reduction's R0_BLOCK is fixed in its text and counts toward the bound.
    src = _generated("mingpt_block")
    facts = sweep.kernel_facts(src, "triton_per_fused_native_layer_norm_0")
    assert facts.fixed_elements == 1024
    assert not sweep.config_ok(facts, {"XBLOCK": 32, "num_warps": 4, "num_stages": 1})


def test_with_config_replaces_one_line():
    src = _generated("bias_gelu")
    new = sweep.with_config(src, "triton_poi_fused_add_gelu_0", {"XBLOCK": 256, "num_warps": 2, "num_stages": 1})
    assert sweep.configs(new) == {"triton_poi_fused_add_gelu_0": {"XBLOCK": 256, "num_warps": 2, "num_stages": 1}}
    assert new.replace("XBLOCK=256, num_warps=2", "XBLOCK=1024, num_warps=4") == src


class RecordedEngine:
    """Answers the Worker's inductor_code request with a recording from tests/data/inductor,
    in the Worker's own answer format."""

    def __init__(self, task: str, modes: dict[str, str]) -> None:
        self.task, self.modes, self.calls = task, modes, []

    async def request(self, op, params, **kw):
        self.calls.append((op, params))
        ref, _, args = load(self.task)
        rows = {}
        for mode, module in self.modes.items():
            if mode not in params["modes"]:
                continue
            if module.endswith(".json"):  # the Worker's row as recorded (a variant same_as or skipped)
                rows[mode] = json.loads((DATA / self.task / module).read_text())
                continue
            _, code, _ = load(self.task, module)
            rows[mode] = {"codes": [code], "args": args, "configs": {}, "seconds": 1.0}
        return {"torch": "2.11.0+cu130", "triton": "3.6.0", "device": "NVIDIA H200", "modes": rows}


def _request(task: Task, parent: Candidate, count: int = 4) -> ProposalRequest:
    return ProposalRequest(task=task, parent=parent, evaluation=None, count=count, device={"cuda": True})


def test_proposer_generates_then_sweeps():
    ref, _, _ = load("relu")
    task = Task(name="relu", reference_path="relu.py", reference_source=ref)
    start = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")
    assert is_module_start(start)
    engine = RecordedEngine("relu", {"default": "default_0.py", "max-autotune-no-cudagraphs": "max-autotune_0.py"})
    prop = InductorProposer(engine)
    assert prop.precheck(start, {"cuda": True}) is None
    assert "needs a CUDA GPU" in prop.precheck(start, {"cuda": False})

    first = asyncio.run(prop.propose(_request(task, start)))
    assert engine.calls[0][0] == "inductor_code" and engine.calls[0][1]["reference_source"] == ref
    cands = [p.candidate for p in first]
    assert len(cands) == 2  # the default and max-autotune files differ (their headers say which)
    assert cands[0].note == "Triton kernels generated from torch.compile (default): 1 Triton kernel"
    assert cands[1].note.startswith("Triton kernels generated from torch.compile (max-autotune)")
    assert prop.label_for(cands[0].id) == cands[0].note
    # The start has nothing more; the generated file is swept, one change at a time.
    assert asyncio.run(prop.propose(_request(task, start))) == []
    sweep_round = asyncio.run(prop.propose(_request(task, cands[0], count=3)))
    assert len(sweep_round) == 3 and all(p.candidate.parent == cands[0].id for p in sweep_round)
    # First the whole forward in one CUDA graph (relu's one kernel left to eager would be the
    # reference itself, so no eager variant), then launch changes.
    graphed = sweep_round[0].candidate
    assert prop.label_for(graphed.id) == ("Triton kernels generated from torch.compile (default), one CUDA graph "
                                          "(inputs copied in, outputs copied out): 1 Triton kernel")
    child = sweep_round[1].candidate
    assert prop.label_for(child.id).startswith("Triton kernels generated from torch.compile (default), tuned: 1 launch change")
    grandchildren = asyncio.run(prop.propose(_request(task, child, count=50)))
    assert grandchildren and "tuned: 2 launch changes" in prop.label_for(grandchildren[0].candidate.id)
    assert all(p.candidate.source != cands[0].source for p in grandchildren)  # no step back
    assert not any(graphs.is_graphed(p.candidate.source) for p in grandchildren)  # the graph is offered once


def test_proposer_offers_eager_ops_in_place_of_a_kernel():
    """KernelBench l1_p23's split softmax: its last kernel (sub, exp, div) has eager ATen ops to
    stand in for it; the four split-reduction kernels do not (they write partial buffers)."""
    ref, _, _ = load("l1_softmax_split")
    task = Task(name="sm", reference_path="sm.py", reference_source=ref)
    start = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")
    prop = InductorProposer(RecordedEngine("l1_softmax_split", {"default": "default_0.py"}), cuda_graphs=False)
    gen = asyncio.run(prop.propose(_request(task, start)))[0].candidate
    assert gen.note == "Triton kernels generated from torch.compile (default): 5 Triton kernels"
    first = asyncio.run(prop.propose(_request(task, gen, count=1)))[0].candidate
    assert first.note == "triton_poi_fused__softmax_exp_sub_4 left to eager (aten.sub, aten.exp, aten.div)"
    assert prop.label_for(first.id) == ("Triton kernels generated from torch.compile (default), 1 eager op kept: "
                                        "4 Triton kernels")
    assert "def triton_poi_fused__softmax_exp_sub_4(" not in first.source
    assert "'triton_poi_fused__softmax_exp_sub_4'" not in first.source  # no CONFIGS or launcher row left
    assert "buf4 = _keep_layout(torch.ops.aten.div.Tensor(_e_exp_default, buf3), buf4)" in first.source
    # The kept op's file is swept like any other; its children keep the count.
    more = asyncio.run(prop.propose(_request(task, first, count=1)))[0].candidate
    assert prop.label_for(more.id).startswith("Triton kernels generated from torch.compile (default), tuned: 1 "
                                              "launch change, 1 eager op kept: 4 Triton kernels")


def test_proposer_says_why_when_nothing_converts():
    ref, _, _ = load("relu")
    task = Task(name="relu", reference_path="relu.py", reference_source=ref)
    start = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")

    class NoGPU:
        async def request(self, op, params, **kw):
            return {"why": "no CUDA GPU is visible here: torch.compile writes its Triton kernels for a GPU"}

    out = asyncio.run(InductorProposer(NoGPU()).propose(_request(task, start)))
    assert len(out) == 1 and out[0].fatal and out[0].candidate is None
    assert "no CUDA GPU is visible here" in out[0].error


def test_convert_recording_keeps_each_modes_reason():
    ref, code, args = load("relu")
    gens, why = convert_recording(ref, {"modes": {
        "default": {"codes": [code], "args": args},
        "max-autotune-no-cudagraphs": {"codes": [code, code], "args": args},
        "other": {"error": "torch.compile failed on this module: Unsupported: data-dependent shape"},
        "default-unsplit-reductions": {"skipped": "not recorded: torch.compile's default code has no reduction"},
        "default-aggressive-fusion": {"codes": [], "same_as": "default"}}})
    assert list(gens) == ["default"]
    assert "graph breaks" in why["max-autotune-no-cudagraphs"] and "data-dependent" in why["other"]
    assert why["default-unsplit-reductions"] == "not recorded: torch.compile's default code has no reduction"
    assert why["default-aggressive-fusion"] == "the same code as torch.compile's default"


def test_a_module_with_its_own_kernel_keeps_the_constant_tuner():
    from kernel_lsp.cli.optimize import module_proposer
    from kernel_lsp.agent.tuner import TunerProposer

    ref, _, _ = load("relu")
    bare = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")
    assert isinstance(module_proposer(TunerProposer(), bare), InductorProposer)
    own = Candidate(source=_generated("relu"), kind="python")
    assert isinstance(module_proposer(TunerProposer(), own), TunerProposer)


def test_a_modelnew_with_its_own_constants_keeps_the_constant_tuner():
    from kernel_lsp.agent.tuner import TunerProposer
    from kernel_lsp.nollm.proposer import for_start

    ref, _, _ = load("relu")  # ROWS, COLS: the reference's shapes, not tunables of a ModelNew
    chunked = ref + "\n\nCHUNK = 4\n\n\nclass ModelNew(Model):\n    def forward(self, x):\n" \
        "        return torch.cat([torch.relu(c) for c in x.chunk(CHUNK)])\n"
    assert isinstance(for_start(TunerProposer(), Candidate(source=chunked, kind="python")), TunerProposer)


def test_variants_are_options_this_torch_has_and_a_missing_one_is_one_sentence(monkeypatch):
    import torch._inductor.config as inductor_config

    from kernel_lsp.engine.worker import inductor_code

    assert inductor_code.SEARCH_MODES == ("default", *inductor_code.VARIANTS, "max-autotune-no-cudagraphs")
    for mode, variant in inductor_code.VARIANTS.items():
        patch = variant.options
        assert inductor_code.options_of(mode) == patch
        with inductor_config.patch(inductor_code.recording_options(mode, inductor_code.options_of(mode))):
            for key, value in patch.items():
                assert getattr(inductor_config, key) == value
    assert inductor_code.options_of("default") == {}
    assert inductor_code.options_of("max-autotune-no-cudagraphs")["max_autotune"] is True
    monkeypatch.setitem(inductor_code.VARIANTS, "default-bogus",
                        inductor_code.Variant({"triton.no_such_choice": True}, "bogus", (("x", 1),), "no x"))
    with pytest.raises(ValueError, match=r"has no Inductor option 'triton.no_such_choice'$"):
        inductor_code.options_of("default-bogus")
    with pytest.raises(ValueError, match="torch.compile has no mode 'fastest'"):
        inductor_code.options_of("fastest")


def test_a_variant_is_compared_on_code_not_comments():
    from kernel_lsp.engine.worker.inductor_code import _code_only

    _, code, _ = load("l1_softmax_split")
    head = "\ndef triton_red_fused_prepare_softmax_online_0("
    assert head in code
    noted = code.replace(head, "\n    # Source Nodes: [softmax]" + head, 1)
    assert noted != code and _code_only([noted]) == _code_only([code])
    other = code.replace("xoffset = tl.program_id(0) * XBLOCK", "xoffset = tl.program_id(1) * XBLOCK", 1)
    assert other != code and _code_only([other]) != _code_only([code])


def test_the_search_records_the_variants_and_offers_each_distinct_file_once():
    """The first round asks the Worker for every mode and variant (l1_p23's softmax as the Worker
    recorded it on an H100); a variant the Worker found the same as the default, or skipped, or
    whose file comes out the same, is no second candidate and says why."""
    from kernel_lsp.engine.worker.inductor_code import SEARCH_MODES

    ref, _, _ = load("l1_softmax_variants")
    task = Task(name="sm", reference_path="sm.py", reference_source=ref)
    start = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")
    engine = RecordedEngine("l1_softmax_variants", {
        "default": "default_0.py", "default-unsplit-reductions": "default-unsplit-reductions_0.py",
        "default-aggressive-fusion": "default-aggressive-fusion.json", "default-layout-kept": "default-layout-kept.json"})
    prop = InductorProposer(engine)
    cands = [p.candidate for p in asyncio.run(prop.propose(_request(task, start)))]
    assert engine.calls[0][1]["modes"] == list(SEARCH_MODES)
    assert engine.calls[0][1]["variants_within_s"] == prop.timeout / 2
    assert [c.note for c in cands] == [
        "Triton kernels generated from torch.compile (default): 5 Triton kernels",
        "Triton kernels generated from torch.compile (default, reductions not split): 1 Triton kernel"]
    assert prop.why == {"default-aggressive-fusion": "the same code as torch.compile's default",
                        "default-layout-kept": "not recorded: torch.compile's default code has no convolution"}

    ref, _, _ = load("relu")
    task = Task(name="relu", reference_path="relu.py", reference_source=ref)
    start = Candidate(source=ref + "\n\nclass ModelNew(Model):\n    pass\n", kind="python")
    same = RecordedEngine("relu", {"default": "default_0.py", "default-unsplit-reductions": "default_0.py"})
    prop = InductorProposer(same, modes=("default", "default-unsplit-reductions"))
    cands = [p.candidate for p in asyncio.run(prop.propose(_request(task, start)))]
    assert same.calls[0][1]["modes"] == ["default", "default-unsplit-reductions"]
    assert len(cands) == 1 and prop.why == {"default-unsplit-reductions": "the same file as torch.compile's default"}


def test_a_variant_is_recorded_only_where_the_defaults_code_has_what_it_changes():
    from kernel_lsp.engine.worker.inductor_code import VARIANTS, variant_skip

    def skipped(task):
        code = load(task)[1]
        return {m for m in VARIANTS if variant_skip(m, [code])}

    # relu: one pointwise kernel; nothing to unsplit, tile, loop or fuse, one kernel to tune.
    assert skipped("relu") == set(VARIANTS) - {"default-coordinate-descent"}
    # A convolution and its epilogue: its layout is a choice, and there are kernels to tune.
    assert skipped("l2_conv3d_mish_tanh") == set(VARIANTS) - {"default-coordinate-descent", "default-layout-kept"}
    assert variant_skip("default-unsplit-reductions", [load("relu")[1]]) == (
        "not recorded: torch.compile's default code has fewer than two reduction kernels, one of them looped, so "
        "no split reduction")
    # A split L1 norm as Inductor writes it for 16 x 16384 (l1_p38): a looped partial sum, a
    # persistent sum of the partials, the division. Two persistent reductions are not a split.
    split_norm = "".join(f"{k} = async_compile.triton('{k}', '''\n" for k in (
        "triton_red_fused_abs_sum_0", "triton_per_fused_abs_sum_1", "triton_poi_fused_div_2"))
    assert variant_skip("default-unsplit-reductions", [split_norm]) is None
    two_persistent = split_norm.replace("triton_red_", "triton_per_")
    assert variant_skip("default-unsplit-reductions", [two_persistent]).startswith("not recorded")
    # l1_p23's split softmax: looped reductions (split), a persistent one, five kernels.
    assert skipped("l1_softmax_split") == {"default-layout-kept"}
    # rmsnorm: one persistent reduction; only the looped variant and the tuner apply.
    assert skipped("l1_rmsnorm") == {"default-unsplit-reductions", "default-tiled-reductions",
                                     "default-aggressive-fusion", "default-layout-kept"}
    # What the Worker itself decided for l1_p23's softmax on an H100 (its rows as recorded).
    rec = DATA / "l1_softmax_variants"
    assert json.loads((rec / "default-layout-kept.json").read_text()) == {
        "skipped": variant_skip("default-layout-kept", [load("l1_softmax_variants")[1]])}
    # Without a default recording every variant is recorded.
    assert all(variant_skip(m, None) is None for m in VARIANTS)
