"""The Worker's inductor_code request through a real Worker process: where torch.compile cannot
write GPU kernels (the GPU hidden here, so the test means the same on the device machine) it
answers one sentence, no exception, no traceback."""

from __future__ import annotations

import asyncio

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.nollm.proposer import generate

from .fixtures import load

pytest.importorskip("torch")


def test_inductor_code_without_a_gpu_says_why():
    ref, _, _ = load("relu")

    async def main():
        async with Engine(timeout=120.0, sandbox="off", env={"CUDA_VISIBLE_DEVICES": ""}) as engine:
            rec = await engine.request("inductor_code", {"reference_source": ref}, timeout=120.0)
            gens, why = await generate(engine, ref)
            return rec, gens, why

    rec, gens, why = asyncio.run(main())
    assert set(rec) == {"why"}
    assert ("CPU-only build" in rec["why"] or "no CUDA GPU is visible here" in rec["why"]), rec
    assert "\n" not in rec["why"]
    assert gens == {} and why == {"*": rec["why"]}
