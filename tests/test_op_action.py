"""The hot-op action's pure parts: which ops an action at a line targets, and the summary's words."""

from pathlib import Path
from types import SimpleNamespace

from kernel_lsp.agent.whole_model import optimized_path
from kernel_lsp.server.op_action import describe, ops_for

BLOCK = (Path(__file__).parent / "agent" / "tasks" / "block.py").read_text()


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines()) if needle in line)


def test_ops_for_the_line_the_action_sits_on():
    assert ops_for(BLOCK, line_of(BLOCK, "return self.norm(self.act(self.fc(x)))"), False) == ["norm", "act", "fc"]
    assert ops_for(BLOCK, line_of(BLOCK, "mu = r.mean()"), False) == ["norm"]
    # a Parameter is a tensor, not an op
    assert ops_for(BLOCK, line_of(BLOCK, "self.weight = nn.Parameter(torch.randn(out"), False) == []
    # the hot-op note sits on `class Model`: one action per submodule of Model; elsewhere none
    assert ops_for(BLOCK, line_of(BLOCK, "class Model(nn.Module)"), True) == ["fc", "act", "norm"]
    assert ops_for(BLOCK, line_of(BLOCK, "class Model(nn.Module)"), False) == []
    assert ops_for("def broken(:\n", 0, True) == []


def test_describe_gives_share_speedups_spread_kind_and_end_to_end():
    op = SimpleNamespace(name="norm", share=0.61, speedup=3.2, spread_pct=4.0, speedup_compile=0.9,
                         label="custom kernel")
    result = SimpleNamespace(end_to_end={"speedup_eager": 1.4, "speedup_compile": 0.8, "spread_pct": 1.5,
                                         "device": "NVIDIA H200"})
    text = describe(op, result)
    assert text == ("norm: 61% of forward, 3.20x alone ±4% vs eager, 0.90x vs torch.compile of the op "
                    "(custom kernel) · model end to end 1.40x eager, 0.80x torch.compile ±1.5% on NVIDIA H200; "
                    "torch.compile of the whole model is faster still: consider it")
    none = SimpleNamespace(name="act", share=0.1, speedup=None, spread_pct=None, speedup_compile=None, label="")
    assert describe(none, SimpleNamespace(end_to_end=None)) == "act: 10% of forward"


def test_optimized_path_never_over_a_file_kernel_lsp_did_not_write(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("x = 1\n")
    assert optimized_path(str(model)) == (str(tmp_path / "m_optimized.py"), "")
    (tmp_path / "m_optimized.py").write_text("# mine\n")
    out, why = optimized_path(str(model))
    assert out is None and "not written by kernel-lsp" in why
    (tmp_path / "m_optimized.py").write_text('"""Written by `kernel-lsp optimize m.py --whole-model`."""\n')
    assert optimized_path(str(model))[0] == str(tmp_path / "m_optimized.py")
