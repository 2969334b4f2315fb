"""kernel_lsp.verdicts: the reason strings and exit codes every front end shows (no torch)."""

from __future__ import annotations

import subprocess
import sys

from kernel_lsp import verdicts
from kernel_lsp.model import Evaluation, Timing


def t(ms: float, spread: float = 1.0) -> Timing:
    return Timing(median_ms=ms, min_ms=ms, max_ms=ms, spread_pct=spread, runs=20)


def test_imports_without_torch_or_openai() -> None:
    code = ("import sys; import kernel_lsp.verdicts, kernel_lsp.model; "
            "assert 'torch' not in sys.modules and 'openai' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_exit_codes_one_rule() -> None:
    assert [verdicts.exit_code(o) for o in ("improved", "no_improvement", "cannot_run")] == [0, 1, 2]
    assert isinstance(verdicts.NoModelConfigured(), verdicts.CannotRun)
    assert verdicts.NoModelConfigured().kind == "no_model" and "KERNEL_LSP_MODEL" in verdicts.NO_MODEL
    assert verdicts.EndpointUnreachable("x").kind == "endpoint_unreachable"


def test_evaluation_reason_says_what_happened() -> None:
    not_run = Evaluation(task="t", candidate="c", verdict="not_run", message=f"built; {verdicts.NO_GPU}")
    assert verdicts.evaluation_reason(not_run) == "built; a .cu candidate needs a GPU to run; none is visible"
    rewrite = Evaluation(task="t", candidate="c", verdict="correct", correct=True, message="matches",
                         time=t(2.0, 66.9), eager=t(3.16), compiled=t(1.0), custom_kernel=False)
    text = verdicts.evaluation_reason(rewrite)
    assert "PyTorch rewrite (no custom kernel)" in text and "1.58x eager" in text and "0.50x torch.compile" in text
    assert "spread 66.9 % is above 10 %: noisy" in text and "try torch.compile" in text
    assert rewrite.noisy and rewrite.compile_faster and rewrite.label == verdicts.PYTORCH_REWRITE
    # The same from its JSON forms.
    assert verdicts.evaluation_reason(rewrite.summary()) == text
    assert verdicts.evaluation_reason(rewrite.to_dict()) == text
    assert "not counted (kernels_only: a PyTorch rewrite)" in verdicts.evaluation_reason(rewrite, kernels_only=True)
    kernel = Evaluation(task="t", candidate="c", verdict="correct", correct=True, message="matches",
                        time=t(1.0), eager=t(2.0), custom_kernel=True,
                        shared_gpu={"count": 2, "processes": [], "source": "nvml", "spread_pct": 4.0})
    text = verdicts.evaluation_reason(kernel)
    assert "custom kernel" in text and "2.00x eager" in text and "noisy" not in text
    assert "timed on a shared GPU (2 other processes used it); spread 4.0 %" in text
    wrong = Evaluation(task="t", candidate="c", verdict="mismatch", correct=False, message="output differs")
    assert verdicts.evaluation_reason(wrong) == "mismatch: output differs"


def test_search_reason_from_json() -> None:
    doc = {"outcome": "cannot_run", "reason": verdicts.NO_MODEL}
    assert verdicts.search_reason(doc).startswith("could not run: no model configured")
    doc = {"outcome": "no_improvement", "reason": "proposal budget spent (4/4); every candidate was slower"}
    assert verdicts.search_reason(doc) == "no improvement: proposal budget spent (4/4); every candidate was slower"
    doc = {"outcome": "improved", "improved": True, "speedup": 5.38, "measurement": "confirmation",
           "label": "custom kernel", "speedup_eager": 5.38, "speedup_compile": 0.61, "spread_pct": 2.0}
    text = verdicts.search_reason(doc)
    assert text.startswith("improved 5.38x over the start (confirmation), custom kernel")
    assert "0.61x torch.compile" in text and "torch.compile of the reference is faster (1.64x" in text


def test_label_and_shared_gpu_survive_the_store(tmp_path) -> None:
    from kernel_lsp.model import Candidate, Task
    from kernel_lsp.store import Store

    store = Store(tmp_path / "s.sqlite")
    store.add_task(Task(name="t", reference_path="t.py", reference_source="x"))
    cand = Candidate(source="y", kind="python")
    store.add_evaluation("t", Evaluation(task="t", candidate=cand.id, verdict="correct", correct=True,
                                         time=t(1.0), custom_kernel=False,
                                         shared_gpu={"count": 1, "processes": [], "source": "nvml"}), cand)
    back = store.latest("t")
    assert back.custom_kernel is False and back.label == verdicts.PYTORCH_REWRITE
    assert back.shared_gpu["count"] == 1
