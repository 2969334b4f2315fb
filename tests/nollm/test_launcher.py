"""The generated files' launcher, with stand-ins for Triton (not installed on the CPU machines):
the first call on a device compiles through the JIT; later calls go to the compiled kernel's own
launcher with the arguments in the order Triton's runner passes them (checked against Triton 3.3
to 3.6's sources), or to Triton's public runner on other versions or while a launch hook is
installed; the interpreter keeps the JIT launch. The GPU tests (tests/nollm/test_gpu.py) run it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.nollm.writer import LAUNCHER  # noqa: E402


class Compiled:
    """A compiled kernel: its launcher (`run`), handles, and the public runner `compiled[grid]`."""

    def __init__(self, calls: list, interpreted: bool = False) -> None:
        self.calls = calls
        if not interpreted:
            self.packed_metadata = "META"
        self.function = None
        self.run = None

    def __getitem__(self, grid):
        self.function = "FUNCTION"  # Triton loads the handles here (_init_handles)
        self.run = lambda *a: self.calls.append(("launcher", a))
        return lambda *args: self.calls.append(("runner", grid, args))


class Kernel:
    def __init__(self, calls: list, interpreted: bool = False) -> None:
        self.calls, self.interpreted = calls, interpreted

    def __getitem__(self, grid):
        def launch(*args, **cfg):
            self.calls.append(("jit", grid, args, cfg))
            return Compiled(self.calls, self.interpreted)
        return launch


def launcher(version: str = "3.6.0", hooks: list | None = None, interpreted: bool = False, plain_hook=None):
    calls: list = []
    chain = plain_hook if plain_hook is not None else SimpleNamespace(calls=hooks or [])  # 3.4/3.5: a function
    triton = SimpleNamespace(__version__=version,
                             knobs=SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=chain)))
    fake_torch = SimpleNamespace(_C=SimpleNamespace(_cuda_getCurrentRawStream=lambda index: 7000 + index),
                                 cuda=SimpleNamespace(current_device=lambda: 0))
    ns = {"triton": triton, "torch": fake_torch, "CONFIGS": {"k": {"XBLOCK": 64, "num_warps": 4}}}
    exec(LAUNCHER, ns)
    return ns["_Launcher"](Kernel(calls, interpreted), "k", ("XBLOCK",), lambda cfg: (4096 // cfg["XBLOCK"], 1, 1)), calls


def test_later_calls_go_to_the_compiled_kernels_launcher_in_the_runners_order():
    run, calls = launcher()
    dev = torch.device("cuda", 1)
    run(dev, "x", "y", 4096)
    run(dev, "x2", "y2", 4096)
    assert calls[0] == ("jit", (64, 1, 1), ("x", "y", 4096), {"XBLOCK": 64, "num_warps": 4})
    # grid, the device's stream, function, packed metadata, launch metadata and both hooks (None),
    # then the kernel's arguments and its constexprs: what Triton's runner passes to compiled.run
    assert calls[1] == ("launcher", (64, 1, 1, 7001, "FUNCTION", "META", None, None, None, "x2", "y2", 4096, 64))
    assert len(calls) == 2


@pytest.mark.parametrize("version,hooks", [("3.7.0", None), ("3.2.0", None), ("3.6.0", [print])])
def test_other_triton_versions_and_installed_hooks_keep_tritons_runner(version, hooks):
    run, calls = launcher(version, hooks)
    dev = torch.device("cuda", 0)
    run(dev, "x", 8)
    run(dev, "x2", 8)
    assert calls[1] == ("runner", (64, 1, 1), ("x2", 8, 64))


def test_a_plain_hook_function_keeps_tritons_runner():
    run, calls = launcher("3.5.0", plain_hook=print)
    dev = torch.device("cuda", 0)
    run(dev, "x")
    run(dev, "x2")
    assert calls[1][0] == "runner"


def test_the_interpreter_keeps_the_jit_launch():
    run, calls = launcher(interpreted=True)
    dev = torch.device("cuda", 0)
    run(dev, "x")
    run(dev, "x2")
    assert [c[0] for c in calls] == ["jit", "jit"] and calls[1][2] == ("x2",)
