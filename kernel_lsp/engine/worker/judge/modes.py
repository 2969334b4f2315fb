"""Does the reference behave differently in training and eval mode, and can training be checked?

Two ways, both used: by type (BatchNorm*, InstanceNorm* with running statistics, Dropout*,
RReLU: named in the notes) and by behaviour (the reference's own output on one input set in
eval mode against training mode; a forward that reads `self.training` itself is caught there).
Training mode is random when two training-mode calls on the same inputs under different seeds
differ (Dropout): then only eval mode can be verified, and the Evaluation says so.

Every training-mode call starts from the state the module was built in (`States`): BatchNorm
updates its running statistics on each one, and the candidate and the reference must start
from the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.modules.instancenorm import _InstanceNorm

from kernel_lsp.engine.worker.judge import accuracy
from kernel_lsp.engine.worker.harness import clone_inputs, flat_tensors, set_seed


def _depends_on_mode(m: nn.Module) -> bool:
    if isinstance(m, _InstanceNorm):
        return m.track_running_stats
    if isinstance(m, _DropoutNd):
        return m.p != 0
    return isinstance(m, (_BatchNorm, nn.RReLU))


def mode_modules(model: nn.Module) -> list[str]:
    """'name (Type)' of every submodule whose forward depends on `training`."""
    return [f"{name or 'model'} ({type(m).__name__})" for name, m in model.named_modules() if _depends_on_mode(m)]


class States:
    """The parameters and buffers of some modules, as they were: put back before each call."""

    def __init__(self, *modules: Any) -> None:
        self.saved = [(m, {k: v.detach().clone() for k, v in m.state_dict().items()})
                      for m in modules if isinstance(m, nn.Module)]

    def restore(self) -> None:
        with torch.no_grad():
            for m, state in self.saved:
                for k, v in m.state_dict().items():
                    if k in state and v.shape == state[k].shape:
                        v.copy_(state[k])


def set_mode(train: bool, *modules: Any) -> None:
    for m in modules:
        if isinstance(m, nn.Module):
            m.train(train)


def _same(a: Any, b: Any, close: bool = False) -> bool:
    """Equal outputs; `close`: within 1e-3 (atomics may reorder a sum between two calls). By
    chunks, across devices: the largest Tasks keep the eval-mode output on the host."""
    ta, tb = flat_tensors(a), flat_tensors(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x.shape != y.shape:
            return False
        fx, fy = x.detach().reshape(-1), y.detach().reshape(-1)
        at = accuracy.compute_device(x, y)  # on the GPU when either is there: host float64 is slow
        scale = None
        if close and x.is_floating_point():
            scale = 1e-3 * float(sum(float(c.double().abs().sum()) for _, (c,) in accuracy.chunks(at, fy))
                                 / max(1, fy.numel()) or 1)
        for _, (chx, chy) in accuracy.chunks(at, fx, fy):
            cx, cy = torch.nan_to_num(chx), torch.nan_to_num(chy)
            if scale is not None:
                if not torch.allclose(cx.double(), cy.double(), rtol=1e-3, atol=scale):
                    return False
            elif not torch.equal(cx, cy):
                return False
    return True


@dataclass
class ModeProbe:
    dependent: bool = False                 # training and eval differ
    random_in_training: bool = False        # two training calls differ (Dropout)
    modules: list[str] = field(default_factory=list)
    error: str | None = None                # the reference raised in training mode


def probe(model: nn.Module, inputs: list[Any], seed: int, call: Callable[..., Any],
          evaluated: Any = None) -> ModeProbe:
    """Run the reference in eval mode and twice in training mode (state put back each time).
    `evaluated`: its eval-mode output on `inputs` when the caller already has it (not run again)."""
    res = ModeProbe(modules=mode_modules(model))
    states = States(model)
    was_training = model.training
    try:
        if evaluated is None:
            set_mode(False, model)
            evaluated = call(model, clone_inputs(inputs))
        set_mode(True, model)
        set_seed(seed)
        first = call(model, clone_inputs(inputs))
        states.restore()
        set_seed(seed + 1)
        second = call(model, clone_inputs(inputs))
        res.dependent = bool(res.modules) or not _same(evaluated, first)
        res.random_in_training = not _same(first, second, close=True)
    except Exception as exc:  # the reference itself fails in training mode: only eval is checked
        res.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    finally:
        states.restore()
        set_mode(was_training, model)
    return res
