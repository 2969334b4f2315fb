"""Facts read from source that are not Targets: launch sites, exports, macros, constants,
the KernelBench task shape of a Python file, and CUDA text embedded in Python strings.

Spans are 0-based lines and code-point columns (kernel_lsp.model.Span). Facts found in an
embedded CUDA string carry `embedded` (its index in Document.embedded) and spans already
mapped into the Python file.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from kernel_lsp.model import Span

if TYPE_CHECKING:
    from kernel_lsp.source.document import Document
    from kernel_lsp.source.text import LineIndex


@dataclass
class Launch:
    """A `kernel<<<grid, block, shmem, stream>>>(args)` site."""

    kernel: str                  # the launched name without template arguments ("ns::k" keeps its scope)
    name: str                    # as written, template arguments included: "k<float, 256>"
    template_args: list[str]
    grid: str
    block: str
    shared_mem: str | None       # None when not given (0 bytes)
    stream: str | None           # None: the default stream
    args: list[str]
    span: Span                   # the whole call expression
    name_span: Span              # the launched name as written
    config_span: Span            # from "<<<" to ">>>"
    function: str | None = None  # the enclosing function, if any
    embedded: int | None = None
    block_threads: int | None = None  # threads per block, when `block` resolves to integers (dim3 multiplied)


ExportVia = Literal["pybind11", "torch_library", "torch_library_impl", "extern_c", "load_inline"]


@dataclass
class HostFunction:
    """A host function defined in a CUDA/C++ source (a candidate for an export)."""

    name: str
    span: Span
    name_span: Span
    detail: str                  # the signature, one line
    params: list[dict[str, str]] = field(default_factory=list)
    embedded: int | None = None


@dataclass
class Export:
    """A host function reachable from Python (load_inline: named in `functions=[...]`)."""

    name: str                    # the name Python sees (op name for TORCH_LIBRARY)
    function: str | None         # the C++ function bound to it, when one is named
    via: ExportVia
    span: Span                   # the binding call (m.def/m.impl) or the extern "C" function
    name_span: Span              # the name string / identifier
    library: str | None = None   # TORCH_LIBRARY namespace
    dispatch_key: str | None = None  # TORCH_LIBRARY_IMPL key (CUDA, CPU, ...)
    schema: str | None = None    # TORCH_LIBRARY m.def schema, e.g. "foo(Tensor x) -> Tensor"
    embedded: int | None = None


@dataclass
class Define:
    """An object-like `#define NAME value`."""

    name: str
    value: str                   # the replacement text, stripped ("" when none)
    int_value: int | None        # the value as an integer, when it is an integer expression
    span: Span
    name_span: Span
    value_span: Span | None      # where an edit of the value goes
    embedded: int | None = None


@dataclass
class Constant:
    """A `constexpr` integer constant (`constexpr int BLOCK = 256;`)."""

    name: str
    type: str
    value: str
    int_value: int | None
    span: Span                   # the declarator `NAME = value`
    name_span: Span
    value_span: Span
    function: str | None = None  # set when declared inside a function
    embedded: int | None = None


@dataclass
class TaskInfo:
    """The KernelBench shape of a Python file (the task contract: class Model, get_inputs, get_init_inputs)."""

    has_model: bool = False
    has_model_new: bool = False
    has_get_inputs: bool = False
    has_get_init_inputs: bool = False
    spans: dict[str, Span] = field(default_factory=dict)  # "Model", "ModelNew", "get_inputs", "get_init_inputs"

    @property
    def is_reference(self) -> bool:
        """A reference Task: Model, get_inputs and get_init_inputs all present."""
        return self.has_model and self.has_get_inputs and self.has_get_init_inputs

    @property
    def is_candidate(self) -> bool:
        return self.has_model_new


@dataclass
class EmbeddedSource:
    """CUDA or C++ text held in a Python string passed to load_inline.

    `text` is the string's value. Positions in `text` map back to the Python file with
    `to_document`; line 0 of `text` is the line the string content starts on (right after
    the opening quotes, so a triple-quoted string that begins with a newline has an empty
    line 0 on the quotes' line).
    """

    text: str
    kind: Literal["cuda", "cpp"]
    span: Span                   # the string content (first to last piece when concatenated)
    call_span: Span              # the load_inline call
    variable: str | None = None  # the name the string was bound to, if passed by name
    module_name: str | None = None   # load_inline(name=...)
    functions: list[str] = field(default_factory=list)  # load_inline(functions=[...])
    implicit_headers: bool = True    # False for load_inline(no_implicit_headers=True)
    document: Document | None = field(default=None, repr=False, compare=False)  # the text parsed as CUDA
    # offsets[i]: code-point offset in the file of text[i]; offsets[len(text)]: just past the end
    _offsets: list[int] = field(default_factory=list, repr=False, compare=False)
    _file: LineIndex | None = field(default=None, repr=False, compare=False)
    _line_starts: list[int] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._line_starts:
            starts, pos = [0], self.text.find("\n")
            while pos != -1:
                starts.append(pos + 1)
                pos = self.text.find("\n", pos + 1)
            self._line_starts = starts

    def _index(self, line: int, col: int) -> int:
        if line < 0:
            return 0
        if line >= len(self._line_starts):
            return len(self.text)
        start = self._line_starts[line]
        end = self._line_starts[line + 1] - 1 if line + 1 < len(self._line_starts) else len(self.text)
        return min(start + max(col, 0), end)

    def to_document(self, line: int, col: int) -> tuple[int, int]:
        """Map (line, col) in `text` to (line, col) in the Python file (clamped to the string)."""
        if self._file is None or not self._offsets:
            return line + self.span.start_line, col
        return self._file.position(self._offsets[self._index(line, col)])

    def map_span(self, span: Span) -> Span:
        """Map a Span in `text` to the Python file."""
        sl, sc = self.to_document(span.start_line, span.start_col)
        el, ec = self.to_document(span.end_line, span.end_col)
        return Span(sl, sc, el, ec)

    def from_document(self, line: int, col: int) -> tuple[int, int] | None:
        """Map a position in the Python file into `text`; None when it lies outside the string."""
        if self._file is None or not self._offsets:
            return None
        offset = self._file.offset(line, col)
        i = bisect.bisect_left(self._offsets, offset)
        if i >= len(self._offsets) or self._offsets[i] != offset:
            return None
        row = bisect.bisect_right(self._line_starts, i) - 1
        return row, i - self._line_starts[row]
