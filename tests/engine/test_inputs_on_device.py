"""Where get_inputs() draws: on the host as written, except a set of at least 1 MiB on a GPU, drawn
there (harness.DEVICE_INPUTS_BYTES), with a note from 256 MiB (harness.NOTE_INPUTS_BYTES). The
choice is sized on the meta device, which draws nothing.

No GPU here: the choice is exercised with the meta device standing in for the GPU (the same
`with torch.device(...)` path), a threshold lowered, and get_inputs variants that cannot run
under a device context (they fall back to the host, as written)."""

from __future__ import annotations

import types

import pytest
import torch

from kernel_lsp.engine.worker import harness as hmod
from kernel_lsp.model import Task


def _harness(body: str, monkeypatch, threshold: int = 1024, note_from: int = 1024) -> hmod.Harness:
    src = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n" + body + \
          "\ndef get_init_inputs():\n    return []\n"
    h = hmod.Harness.__new__(hmod.Harness)
    h.device = torch.device("meta")  # stands in for the GPU: a device that is not the host
    h.task = Task(name="t", reference_path="/tmp/t.py", reference_source=src)
    h.inputs_on_device, h.inputs_note = None, None
    mod = types.ModuleType("t_ref")
    exec(compile(src, "/tmp/t.py", "exec"), mod.__dict__)
    h.ref_module = mod
    monkeypatch.setattr(hmod, "DEVICE_INPUTS_BYTES", threshold)
    monkeypatch.setattr(hmod, "NOTE_INPUTS_BYTES", note_from)
    # meta plays the GPU here: the real check is `device.type == "cuda"`
    monkeypatch.setattr(hmod.Harness, "_is_gpu", lambda self: True)
    return h


def test_a_large_set_is_drawn_on_the_device_with_a_note(monkeypatch) -> None:
    h = _harness("def get_inputs():\n    return [torch.rand(64, 64)]\n", monkeypatch)
    values = h._draw(1)
    assert values[0].device.type == "meta"  # drawn under the device, not on the host then moved
    assert values[0].shape == (64, 64)
    assert h.inputs_on_device is True
    assert "input sets drawn on the GPU" in (h.inputs_note or "")


def test_a_set_below_the_note_size_is_drawn_on_the_device_without_a_note(monkeypatch) -> None:
    h = _harness("def get_inputs():\n    return [torch.rand(64, 64)]\n", monkeypatch, note_from=1 << 20)
    assert h._draw(1)[0].device.type == "meta"
    assert h.inputs_on_device is True and h.inputs_note is None


def test_a_small_set_is_drawn_on_the_host(monkeypatch) -> None:
    h = _harness("def get_inputs():\n    return [torch.rand(4, 4)]\n", monkeypatch)
    assert h._draw(1)[0].device.type == "cpu"
    assert h.inputs_on_device is False and h.inputs_note is None


@pytest.mark.parametrize("body", [
    # needs host tensors: it reads values back (meta has none)
    "def get_inputs():\n    x = torch.rand(64, 64)\n    return [x * float(x.sum())]\n",
    # asserts where its tensors are
    "def get_inputs():\n    x = torch.rand(64, 64)\n    assert x.device.type == 'cpu'\n    return [x]\n",
])
def test_a_get_inputs_that_needs_the_host_is_drawn_as_written(monkeypatch, body: str) -> None:
    h = _harness(body, monkeypatch)
    assert h._draw(1)[0].device.type == "cpu"
    assert h.inputs_on_device is False and h.inputs_note is None


def test_the_host_draw_is_what_get_inputs_gives_under_the_seed(monkeypatch) -> None:
    h = _harness("def get_inputs():\n    return [torch.rand(4, 4)]\n", monkeypatch)
    h.device = torch.device("cpu")
    monkeypatch.undo()
    a, b = h.make_inputs(7), h.make_inputs(7)
    assert torch.equal(a.values[0], b.values[0])
    hmod.set_seed(7)
    assert torch.equal(a.values[0], torch.rand(4, 4))
    assert h.inputs_on_device is False  # a CPU Task never draws elsewhere


def test_a_draw_that_fails_on_the_device_falls_back_to_the_host_for_good(monkeypatch) -> None:
    # meta sizes it (no values read), but the device draw reads one back: the host draws.
    body = ("calls = []\ndef get_inputs():\n    x = torch.rand(64, 64)\n    calls.append(x.device.type)\n"
            "    if len(calls) == 2:\n        float(x[0, 0])\n    return [x]\n")
    h = _harness(body, monkeypatch)
    assert h._draw(1)[0].device.type == "cpu"
    assert h.ref_module.calls == ["meta", "meta", "cpu"]  # sized, tried on the device, drawn on the host
    assert h.inputs_on_device is False and h.inputs_note is None
    assert h._draw(2)[0].device.type == "cpu" and h.ref_module.calls[-1] == "cpu"
