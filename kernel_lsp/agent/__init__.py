"""The agent: a Search over Candidates made by Proposers (an LLM or the tuner).

Imports no torch and no pygls; `openai` is imported only when an LLMProposer is made.
"""

from .budget import Budget, Pricing
from .patches import ParseError, apply_patches, parse_answer, parse_patches
from .proposer import Proposal, ProposalRequest, Proposer
from .report import render_report, write_report
from .search import Search, SearchEvent, SearchOptions, SearchResult, noise_threshold
from .tuner import TunerProposer, find_tunables, variants


def __getattr__(name: str):
    # LLMProposer lazily: `import kernel_lsp.agent` must work where openai is not installed.
    if name in ("LLMProposer", "LLMConfig", "LLMError"):
        from . import llm

        return getattr(llm, name)
    raise AttributeError(name)


__all__ = [
    "Budget", "Pricing", "ParseError", "apply_patches", "parse_answer", "parse_patches",
    "Proposal", "ProposalRequest", "Proposer", "Search", "SearchEvent", "SearchOptions",
    "SearchResult", "noise_threshold", "TunerProposer", "find_tunables", "variants",
    "render_report", "write_report",
    "LLMProposer", "LLMConfig", "LLMError",
]
