"""torch.compile's compile without running anything (worker/timing/dry_compile.py), on the CPU's
Inductor: the first call compiles and stops before the graph runs; once live the same compiled
module gives torch.compile's answer without compiling again."""

from __future__ import annotations

import pytest
import torch

from kernel_lsp.engine.worker.timing import dry_compile


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.lin(x) * 3.0, dim=1)


class Broken(Scaled):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.lin(x))
        torch._dynamo.graph_break()  # two graphs
        return y * 2.0




@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_first_call_compiles_and_runs_nothing_then_live_runs_without_compiling_again():
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(4, 16)
    dry = dry_compile.DryRun("default")
    compiled = torch.compile(model, backend=dry)
    with torch.no_grad():
        with pytest.raises(dry_compile.NotRun):
            compiled(x)
        assert dry.graphs == 1
        dry.live = True
        got = compiled(x)
        assert dry.graphs == 1  # the compiled graph ran; nothing compiled again
        torch.testing.assert_close(got, model(x))


def test_a_graph_after_a_break_compiles_at_its_first_live_call():
    torch.manual_seed(0)
    model, x = Broken(), torch.randn(4, 16)
    dry = dry_compile.DryRun("default")
    compiled = torch.compile(model, backend=dry)
    with torch.no_grad():
        with pytest.raises(dry_compile.NotRun):
            compiled(x)
        assert dry.graphs == 1  # stopped at the first graph
        dry.live = True
        torch.testing.assert_close(compiled(x), model(x))
    assert dry.graphs == 2


def test_only_the_default_mode_compiles_without_the_gpu():
    assert dry_compile.why_not("max-autotune") and dry_compile.why_not("reduce-overhead")
    assert not dry_compile.why_not("default") and not dry_compile.why_not("")


class Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the reference's own bug")


def test_the_evaluations_compile_without_gpu_hands_back_a_live_module_or_none_with_a_note(monkeypatch):
    """run._compile_without_gpu (its turn points are no-ops outside a request that asked): a live
    compiled module, or None and a note so that the plain compile inside the turn follows."""
    from types import SimpleNamespace

    from kernel_lsp.engine.worker import run

    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(4, 16)
    notes: list[str] = []
    with torch.no_grad():  # as _compile_reference calls it
        compiled = run._compile_without_gpu(SimpleNamespace(model=model), "default", [x], notes)
        assert compiled is not None and notes == []
        torch.testing.assert_close(compiled(x), model(x))
        assert run._compile_without_gpu(SimpleNamespace(model=Fails()), "default", [x], notes) is None
        assert len(notes) == 1 and "ValueError: the reference's own bug" in notes[0]
        monkeypatch.setenv(dry_compile.OFF_ENV, "0")
        assert run._compile_without_gpu(SimpleNamespace(model=model), "default", [x], notes) is None
    assert len(notes) == 1  # turned off: nothing tried, nothing to say


class Untraced(torch.nn.Module):
    @torch._dynamo.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_a_forward_dynamo_does_not_trace_ran_and_says_so():
    from types import SimpleNamespace

    from kernel_lsp.engine.worker import run

    notes: list[str] = []
    with torch.no_grad():
        compiled = run._compile_without_gpu(SimpleNamespace(model=Untraced()), "default", [torch.zeros(2)], notes)
    assert compiled is not None and notes and "no graph" in notes[0]
