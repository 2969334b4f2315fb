"""The whole-model flow on a GPU: the minGPT block's NewGELU op gets a fused CUDA kernel
(load_inline) from the scripted endpoint, its Search verifies it as a custom kernel, and the
block with the kernel behind its guard is verified end to end against eager and torch.compile.
Skips without a CUDA GPU (`pytest -m gpu` on the device)."""

import asyncio
import re
import sys
from pathlib import Path

import pytest

import openai  # noqa: F401,E402  (a dependency of the project: missing is a failure, not a skip)
pytest.importorskip("torch")

from kernel_lsp.agent.llm import LLMConfig, LLMProposer
from kernel_lsp.agent.search import SearchOptions
from kernel_lsp.agent.whole_model import WholeModelOptions, optimize_op
from kernel_lsp.engine import Engine
from kernel_lsp.store import Store

from .openai_server import start

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))
from mingpt_answers import GELU_KERNEL, fenced  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_mingpt_gelu_kernel_integrated(tmp_path):
    # asyncio.run, not pytest-asyncio: the device machine may not have it.
    asyncio.run(_mingpt_gelu_kernel_integrated(tmp_path))


async def _mingpt_gelu_kernel_integrated(tmp_path):
    text = (ROOT / "benchmarks" / "models" / "mingpt_block.py").read_text()
    text = re.sub(r"^BATCH, SEQ, N_EMBD, N_HEAD = .*$", "BATCH, SEQ, N_EMBD, N_HEAD = 8, 256, 768, 12", text,
                  flags=re.M)
    model = tmp_path / "mingpt_block.py"
    model.write_text(text)
    server = start([fenced("one fused kernel", GELU_KERNEL)], default="")
    engine = Engine(timeout=400)
    store = Store(tmp_path / "store.sqlite")
    try:
        result = await optimize_op(
            str(model), "mlp.act", engine, store,
            lambda op: LLMProposer(LLMConfig(model="scripted", base_url=server.base_url, api_key="k",
                                             client_max_retries=0)),
            WholeModelOptions(budget=1, search=SearchOptions(children=1, profile=False, repair_rounds=0)),
            root=str(tmp_path))
    finally:
        await engine.aclose()
        server.close()
    (op,) = result.ops
    assert op.name == "mlp.act" and op.shapes == [[8, 256, 3072]]
    assert op.search is not None and op.search.improved, op.search.reason if op.search else op.reason
    assert op.custom_kernel is True and op.label == "custom kernel"
    first = op.search.start_evaluation.to_dict() if op.search.start_evaluation is not None else None
    assert op.speedup > 1.5 and op.speedup_compile is not None, (op.search.compile_ms, first)
    e = result.end_to_end
    assert e["correct"], e
    assert e["speedup_eager"] is not None and e["speedup_compile"] is not None and e["eager_ms"] > 0
    assert result.improved == (e["faster"] and op.kept)
    assert result.extraction["time"] == "device" and 0 < op.share < 1
