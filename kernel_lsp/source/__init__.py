"""Reading code with tree-sitter: Targets, launch sites, exports and spans.

    from kernel_lsp.source import parse_document, Document
    doc = parse_document("softmax.cu", text)            # .cu/.cuh/.cuda: CUDA; .py: Python
    doc = parse_document("softmax.cu", new_text, old=doc)  # incremental re-parse
    doc.targets, doc.target_at(line, col), doc.kernels, doc.launches, doc.exports,
    doc.defines, doc.constants, doc.embedded, doc.loaded_files, doc.task, doc.syntax_errors

No torch and no pygls here (docs/architecture.md).
"""

from kernel_lsp.source.document import Document, language_for, parse_document
from kernel_lsp.source.records import (
    Constant, Define, EmbeddedSource, Export, HostFunction, Launch, TaskInfo,
)
from kernel_lsp.source.text import LineIndex, SourceError, read_text

__all__ = [
    "Constant", "Define", "Document", "EmbeddedSource", "Export", "Launch", "LineIndex",
    "HostFunction", "SourceError", "TaskInfo", "language_for", "parse_document", "read_text",
]
