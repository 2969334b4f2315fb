"""The structural variants of a generated file, on recorded Inductor output (CPU): eager's ATen ops in
place of one kernel (eager_ops.py), and the whole forward replayed from a CUDA graph (graphs.py).
Running them for real is in test_interpreted.py (eager ops) and test_gpu.py (both, through the engine)."""

from __future__ import annotations

import ast
import types

import pytest
import torch

from kernel_lsp.engine.worker.judge import static_checks
from kernel_lsp.nollm import eager_ops, graphs
from kernel_lsp.nollm.writer import write_model_new

from .fixtures import load


def _gen(task: str):
    ref, code, args = load(task)
    return write_model_new(ref, code, args)


def test_fragments_read_inductors_graph_comments():
    _, code, _ = load("l1_softmax_split")
    frags = eager_ops.fragments(code)
    assert len(frags) == 5
    last = frags["triton_poi_fused__softmax_exp_sub_4"]
    assert last.returns == ["div"] and last.original == ["aten.sub", "aten.exp", "aten._softmax"]
    assert last.nodes["getitem"].kind == "PlaceHolder" and last.nodes["getitem"].size == (16, 1)
    assert last.nodes["div"].target == "torch.ops.aten.div.Tensor" and last.nodes["div"].args == "%exp_default, %getitem_1"
    assert frags["triton_red_fused_prepare_softmax_online_0"].returns == ["buf0"]


def test_only_whole_computations_get_eager_ops_and_the_rest_say_why():
    gen = _gen("l1_softmax_split")
    assert list(gen.eager) == ["triton_poi_fused__softmax_exp_sub_4"]
    op = gen.eager["triton_poi_fused__softmax_exp_sub_4"]
    assert op.ops == ["aten.sub", "aten.exp", "aten.div"]
    # getitem and getitem_1 are read from the buffers the split reductions' last kernels wrote.
    assert op.lines == [
        "# triton_poi_fused__softmax_exp_sub_4 left to eager: aten.sub, aten.exp, aten.div",
        "_e_sub_tensor = torch.ops.aten.sub.Tensor(arg0_1, buf1)",
        "_e_exp_default = torch.ops.aten.exp.default(_e_sub_tensor,)",
        "buf4 = _keep_layout(torch.ops.aten.div.Tensor(_e_exp_default, buf3), buf4)"]
    assert "split reduction" in gen.eager_why["triton_red_fused_prepare_softmax_online_0"]
    assert "several" in _gen("layernorm").eager_why["triton_red_fused_native_layer_norm_0"] or \
        "returns 3 values" in _gen("layernorm").eager_why["triton_red_fused_native_layer_norm_0"]
    assert "in place" in _gen("l2_conv3d_mish_tanh").eager_why["triton_poi_fused_convolution_mish_tanh_0"]
    for why in _gen("mingpt_block").eager_why.values():
        assert "\n" not in why and len(why) < 200


def test_non_aten_and_random_nodes_stay_kernels():
    _, code, _ = load("l1_softmax_split")
    frag = eager_ops.fragments(code)["triton_poi_fused__softmax_exp_sub_4"]
    params = ["in_ptr0", "in_ptr1", "in_ptr2", "out_ptr0", "xnumel"]
    args = ["arg0_1", "buf1", "buf3", "buf4", "262144"]
    known = {"arg0_1": "arg0_1", "getitem": "buf1", "getitem_1": "buf3"}
    assert eager_ops.eager_op(frag, params, args, "L", known, {}).ops == ["aten.sub", "aten.exp", "aten.div"]
    frag.nodes["exp_default"].target = "torch.ops.prims.exp.default"
    with pytest.raises(eager_ops.NotEager, match="not an ATen op"):
        eager_ops.eager_op(frag, params, args, "L", known, {})
    frag.nodes["exp_default"].target = "torch.ops.aten.rand_like.default"
    with pytest.raises(eager_ops.NotEager, match="random"):
        eager_ops.eager_op(frag, params, args, "L", known, {})
    frag.nodes["exp_default"].target = "torch.ops.aten.exp.default"
    with pytest.raises(eager_ops.NotEager, match="no earlier step"):
        eager_ops.eager_op(frag, params, args, "L", {"arg0_1": "arg0_1"}, {})
    # A view of the output made before the launch: the result is copied into it, never rebound.
    op = eager_ops.eager_op(frag, params, args, "L", known, {}, aliased=True)
    assert op.lines[-1] == "buf4.copy_((torch.ops.aten.div.Tensor(_e_exp_default, buf3)).reshape(buf4.shape))"


def test_eager_variant_text():
    gen = _gen("l1_softmax_split")
    src = eager_ops.apply(gen.source, gen.eager["triton_poi_fused__softmax_exp_sub_4"])
    ast.parse(src)
    assert eager_ops.kept_count(src) == 1 and eager_ops.kept_count(gen.source) == 0
    assert "triton_poi_fused__softmax_exp_sub_4" not in src.replace(
        "# triton_poi_fused__softmax_exp_sub_4 left to eager", "")
    assert src.count("def _keep_layout(") == 1
    # Still a file of kernels (four launched), and the engine's scan reads it so.
    assert src.count("LAUNCHERS['") == 4 and src.count(": _Launcher(") == 4 and static_checks.has_kernel(src)
    # custom_kernel only for what it launches itself: eager's ops beside the kernels are PyTorch's
    # work, flagged as torch.mm beside them is (the generated file itself is not).
    ref = load("l1_softmax_split")[0]
    assert static_checks.flags(static_checks.scan(src, "python", ref)) == ["torch_fallback"]
    assert static_checks.flags(static_checks.scan(gen.source, "python", ref)) == []
    # Leaving every kernel to eager is the reference itself, never offered as a variant.
    relu = _gen("relu")
    assert eager_ops.apply(relu.source, relu.eager["triton_poi_fused_relu_0"]) is None
    # Applied once: the launch is gone from the variant.
    assert eager_ops.apply(src, gen.eager["triton_poi_fused__softmax_exp_sub_4"]) is None


def test_eager_ops_run_as_written():
    """The eager lines themselves, run by torch on the CPU against the kernel's math."""
    gen = _gen("l1_softmax_split")
    op = gen.eager["triton_poi_fused__softmax_exp_sub_4"]
    ns = {"torch": torch}
    exec(eager_ops.KEEP_LAYOUT, ns)  # noqa: S102
    x = torch.randn(16, 16384)
    ns.update(arg0_1=x, buf1=x.max(1, keepdim=True).values, buf4=torch.empty(16, 16384))
    ns["buf3"] = torch.exp(x - ns["buf1"]).sum(1, keepdim=True)
    exec("\n".join(op.lines), ns)  # noqa: S102
    assert torch.allclose(ns["buf4"], torch.softmax(x, 1), atol=1e-6)


def test_graphed_variant_text_and_flag():
    gen = _gen("bias_gelu")
    src = graphs.graphed(gen.source)
    ast.parse(src)
    assert graphs.is_graphed(src) and graphs.graphed(src) is None
    fwd = src.split("class ModelNew(Model):", 1)[1]
    # The guard first (other shapes run the reference), then one replay per call, then the launches
    # (what the graph captures).
    assert fwd.index("return super().forward(x)") < fwd.index("return _GRAPHS(self, (x,))") < \
        fwd.index("with torch.no_grad():")
    flags = static_checks.flags(static_checks.scan(src, "python", load("bias_gelu")[0]))
    assert "cuda_graph" in flags  # the engine's rule: a graph the baseline lacks does not count


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: replay re-runs what was captured, on the
    captured tensors, as a real replay does on their memory."""
    last = None

    def __init__(self):
        self.fn = None
        _FakeGraph.last = self

    def replay(self):
        self.fn()


def test_graph_wrapper_copies_inputs_returns_fresh_outputs_and_keys_on_storage():
    """The wrapper's own logic on the CPU (the real capture is test_gpu.py's): each call's inputs reach
    the graph, no two calls share output storage, new parameter storage captures again, a failed
    capture keeps the plain path."""
    fake_cuda = types.SimpleNamespace(CUDAGraph=_FakeGraph, graph=None, synchronize=lambda: None)
    ns: dict = {"torch": types.SimpleNamespace(Tensor=torch.Tensor, cuda=fake_cuda)}  # the file's torch, faked
    exec(graphs.GRAPHS, ns)  # noqa: S102
    captured: list = []

    class Capture:
        def __init__(self, graph):
            self.graph = graph

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))
            self.out = torch.empty(4)

        def forward(self, x):
            if not ns["_GRAPHS"].inside:
                return ns["_GRAPHS"](self, (x,))
            # "Capture": remember the computation on these very tensors, as a graph does.
            captured.append(x)
            fn = lambda: torch.mul(x, self.w, out=self.out)  # noqa: E731
            if _FakeGraph.last is not None and _FakeGraph.last.fn is None:
                _FakeGraph.last.fn = fn
            fn()
            return self.out

    fake_cuda.graph = Capture
    m = M()
    with torch.no_grad():
        a, b = torch.arange(4.0), torch.arange(4.0) * 2
        ra, rb = m(a), m(b)
        assert torch.equal(ra, a) and torch.equal(rb, b)          # each call's inputs, not the first's
        assert ra.data_ptr() != rb.data_ptr() != m.out.data_ptr()  # fresh storage each call
        assert len(ns["_GRAPHS"].graphs) == 1
        m.w = torch.nn.Parameter(torch.full((4,), 3.0))              # new storage: captured again
        assert torch.equal(m(a), a * 3) and len(ns["_GRAPHS"].graphs) == 2

        def broken(graph):
            raise RuntimeError("operation not permitted when stream is capturing")

        fake_cuda.graph = broken
        c = torch.arange(8.0)
        m.w = torch.nn.Parameter(torch.ones(8))
        m.out = torch.empty(8)
        assert torch.equal(m(c), c)                                   # capture failed: plain launches
        assert False in ns["_GRAPHS"].graphs.values()
        fake_cuda.graph = Capture
        for n in range(5, 9):                                          # at most MAX_GRAPHS kept
            m.w, m.out = torch.nn.Parameter(torch.ones(n)), torch.empty(n)
            assert torch.equal(m(torch.arange(float(n))), torch.arange(float(n)))
        assert len(ns["_GRAPHS"].graphs) == ns["MAX_GRAPHS"] == 4
        ns["MAX_INPUT_BYTES"] = 16                                     # large inputs: never captured
        m.w, m.out = torch.nn.Parameter(torch.ones(9)), torch.empty(9)
        assert torch.equal(m(torch.arange(9.0)), torch.arange(9.0))
        assert list(ns["_GRAPHS"].graphs.values())[-1] is False


def test_a_kernel_with_blank_lines_is_removed_whole():
    """Inductor's kernels may hold blank lines (its looped softmax does): the variant drops the whole
    def, and the other kernels stay."""
    gen = _gen("l1_softmax_split")
    name = "triton_poi_fused__softmax_exp_sub_4"
    src = gen.source.replace("    x1 = xindex // 16384\n", "    x1 = xindex // 16384\n\n", 1)
    assert src != gen.source
    out = eager_ops.apply(src, gen.eager[name])
    ast.parse(out)
    assert f"def {name}(" not in out and "x1 = xindex // 16384" not in out
    for k in gen.kernels:
        if k.name != name:
            assert f"@triton.jit\ndef {k.name}(" in out
