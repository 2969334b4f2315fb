"""A turn point tells the caller what the paused evaluation keeps live on its GPU (notify.gpu_held),
which caller/gpu_lock.may_hand_over reads. No GPU here: torch's CUDA calls are replaced by a
recorded card's answers; on a CPU, nothing is said (the caller then decides as before)."""

from __future__ import annotations

import sys
import types

from kernel_lsp.engine import protocol
from kernel_lsp.engine.worker import notify


def _fake_torch(allocated: int, total: int) -> types.ModuleType:
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, current_device=lambda: 0,
                                 memory_allocated=lambda dev: allocated,
                                 get_device_properties=lambda dev: types.SimpleNamespace(total_memory=total))
    mod = types.ModuleType("torch")
    mod.cuda = cuda  # type: ignore[attr-defined]
    return mod


def test_the_turn_point_says_the_live_bytes_and_the_cards_size(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(22 << 30, 85017493504))  # an H100 80GB's total
    sent: list[tuple[str, dict]] = []
    lines = iter([protocol.encode(protocol.resume(1))])
    notify.install(lambda kind, data: sent.append((kind, data)), turns=lambda: next(lines))
    monkeypatch.setattr(notify, "_turns", iter([1]))
    try:
        waited = notify.turn_point("verify_set")
    finally:
        notify.install(None)
    assert waited is not None
    assert sent == [(protocol.PARTIAL_TURN_POINT, {"stage": "verify_set", "turn": 1, "held_bytes": 22 << 30,
                                                   "total_bytes": 85017493504})]


def test_on_a_cpu_nothing_is_said(monkeypatch):
    cpu = types.ModuleType("torch")
    cpu.cuda = types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", cpu)
    assert notify.gpu_held() == {}
    monkeypatch.delitem(sys.modules, "torch")
    assert notify.gpu_held() == {}
