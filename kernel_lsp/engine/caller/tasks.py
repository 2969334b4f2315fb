"""Task discovery: which reference and which Candidate a file stands for.

Standard library only (no torch). The file is read with `ast`, never
executed, so discovery is safe on untrusted text and fast enough for every save.

Rules (the task contract, docs/architecture.md):

* ``foo.py`` with ``Model``, ``get_inputs`` and ``get_init_inputs`` is a reference Task.
  If it also defines ``ModelNew``, the Candidate is the file itself (kind ``python``).
* ``foo.py`` with only ``ModelNew`` is a Candidate; its reference is looked up, first hit wins:
  1. a module-level string ``REFERENCE = "path.py"`` (relative to the file),
  2. ``foo_new.py`` / ``foo_candidate.py`` -> ``foo.py`` (the KernelBench pairing),
  3. ``foo_ref.py``, then ``foo_reference.py`` beside it.
* ``foo.cu`` has its harness ``foo.py`` beside it: KernelBench format plus ``ENTRY = "fn"``
  (the exported function standing for ``Model.forward``) and/or ``kernel_forward(lib, model,
  *inputs)``. The Candidate is the ``.cu`` text (kind ``cuda``). Opening that harness
  ``foo.py`` itself (no ``ModelNew``, with ``ENTRY``/``kernel_forward``) gives the same pair.
* Module-level numeric ``ATOL`` / ``RTOL`` in the reference set the Task's tolerances (they win
  over the float64 accuracy budget); ``MODE = "eval"`` declares an inference Task.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from kernel_lsp.model import Candidate, Task

REFERENCE_NAMES = ("Model", "get_inputs", "get_init_inputs")

# The suffixes a candidate file may carry, and the suffixes a reference may carry.
_CANDIDATE_SUFFIXES = ("_new", "_candidate")
_REFERENCE_SUFFIXES = ("_ref", "_reference")


class TaskError(ValueError):
    """A file is not (or not yet) a complete Task; the message says what is missing."""


@dataclass
class _Facts:
    """What `ast` tells about a Python file's top level."""

    classes: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    constants: dict[str, object] = field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        return self.classes | self.functions | set(self.constants)

    def is_reference(self) -> bool:
        return "Model" in self.classes and {"get_inputs", "get_init_inputs"} <= self.functions

    def missing_reference_parts(self) -> list[str]:
        have = self.classes | self.functions
        return [n for n in REFERENCE_NAMES if n not in have]


def _facts(text: str, path: str) -> _Facts:
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise TaskError(f"{os.path.basename(path)}:{exc.lineno}: syntax error: {exc.msg}") from exc
    facts = _Facts()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            facts.classes.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.functions.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                value = None  # not a literal: the name exists, its value is unknown here
            for target in targets:
                if isinstance(target, ast.Name):
                    facts.constants[target.id] = value
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            # `from x import Model` still defines the name; record it as a class/function.
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                if name == "Model" or name == "ModelNew":
                    facts.classes.add(name)
                elif name in ("get_inputs", "get_init_inputs", "kernel_forward"):
                    facts.functions.add(name)
    return facts


def _read(path: str) -> str:
    """UTF-8 text, undecodable bytes replaced (a Latin-1 comment is no reason to refuse a kernel);
    a binary file is a TaskError, as the source reader does."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if b"\0" in data:
        raise TaskError(f"{path} looks binary (it contains NUL bytes), not source text")
    return data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")


def _tolerance(facts: _Facts, name: str, path: str) -> float | None:
    if name not in facts.constants:
        return None
    value = facts.constants[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TaskError(f"{os.path.basename(path)}: {name} must be a non-negative number literal")
    return float(value)


# MODE = "eval": an inference Task, verified in eval mode only; "both" (the default): verified in
# training mode too when the reference behaves differently there (docs/correctness.md).
MODES = ("eval", "both")


def _mode(facts: _Facts, path: str) -> str | None:
    if "MODE" not in facts.constants:
        return None
    value = facts.constants["MODE"]
    if not isinstance(value, str) or value.lower() not in MODES:
        raise TaskError(f"{os.path.basename(path)}: MODE must be \"eval\" (an inference Task) or \"both\", "
                        f"not {value!r}")
    return value.lower()


def _task(name: str, ref_path: str, ref_text: str, facts: _Facts, **extra: object) -> Task:
    return Task(
        name=name,
        reference_path=os.path.abspath(ref_path),
        reference_source=ref_text,
        atol=_tolerance(facts, "ATOL", ref_path),
        rtol=_tolerance(facts, "RTOL", ref_path),
        mode=_mode(facts, ref_path),
        **extra,  # type: ignore[arg-type]
    )


def _require_reference(facts: _Facts, path: str) -> None:
    missing = facts.missing_reference_parts()
    if missing:
        raise TaskError(
            f"{os.path.basename(path)} is not a complete reference: missing "
            + ", ".join(f"`{m}`" for m in missing)
            + " (KernelBench format: class Model, get_inputs(), get_init_inputs())"
        )


def reference_candidates(path: str, facts: _Facts | None = None) -> list[str]:
    """Where a ModelNew-only file's reference may be, in the order they are tried."""
    folder, base = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(base)[0]
    found: list[str] = []
    if facts is not None and isinstance(facts.constants.get("REFERENCE"), str):
        found.append(os.path.normpath(os.path.join(folder, str(facts.constants["REFERENCE"]))))
    for suffix in _CANDIDATE_SUFFIXES:
        if stem.endswith(suffix) and len(stem) > len(suffix):
            found.append(os.path.join(folder, stem[: -len(suffix)] + ".py"))
    for suffix in _REFERENCE_SUFFIXES:
        found.append(os.path.join(folder, stem + suffix + ".py"))
    return found


def _entry(facts: _Facts, harness_path: str) -> str | None:
    entry = facts.constants.get("ENTRY")
    if "ENTRY" in facts.constants and not isinstance(entry, str):
        raise TaskError(f"{os.path.basename(harness_path)}: ENTRY must be a string literal")
    return entry if isinstance(entry, str) else None


def _cuda_task(cu_path: str, cu_text: str, harness_path: str, harness_text: str) -> tuple[Task, Candidate]:
    facts = _facts(harness_text, harness_path)
    _require_reference(facts, harness_path)
    entry = _entry(facts, harness_path)
    if entry is None and "kernel_forward" not in facts.functions:
        raise TaskError(
            f"{os.path.basename(harness_path)} must say which function of "
            f"{os.path.basename(cu_path)} stands for Model.forward: "
            'ENTRY = "name" and/or def kernel_forward(lib, model, *inputs)'
        )
    stem = os.path.splitext(os.path.basename(cu_path))[0]
    task = _task(stem, harness_path, harness_text, facts,
                 cuda_path=os.path.abspath(cu_path), entry=entry)
    return task, Candidate(source=cu_text, kind="cuda")


def compile_task(path: str, text: str | None = None) -> tuple[Task, Candidate]:
    """A Task for building a .cu alone (no harness needed): repairing a compile error, where the
    compiler is the test. Only `checks=("compile",)` can run on it."""
    if os.path.splitext(path)[1].lower() != ".cu":
        raise TaskError(f"{os.path.basename(path)}: only a .cu builds without a harness")
    cu_text = text if text is not None else _read(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    task = Task(name=stem, reference_path=os.path.splitext(os.path.abspath(path))[0] + ".py",
                reference_source="", cuda_path=os.path.abspath(path))
    return task, Candidate(source=cu_text, kind="cuda")


def find_task(path: str, text: str | None = None) -> tuple[Task, Candidate | None]:
    """The Task a file belongs to, and the Candidate it holds (None for a bare reference).

    `text` is the editor's buffer for `path` (unsaved edits); other files are read from disk.
    Raises TaskError with a one-line reason when a piece is missing.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext in (".cu", ".cuh"):
        if ext == ".cuh":
            raise TaskError(f"{os.path.basename(path)}: a header is not a Task; open the .cu that includes it")
        cu_text = text if text is not None else _read(path)
        harness = os.path.splitext(path)[0] + ".py"
        if not os.path.exists(harness):
            raise TaskError(
                f"{os.path.basename(path)} has no harness: expected {os.path.basename(harness)} beside it "
                "(KernelBench format plus ENTRY = \"exported_function\")"
            )
        return _cuda_task(path, cu_text, harness, _read(harness))

    if ext != ".py":
        raise TaskError(f"{os.path.basename(path)}: only .py and .cu files hold Tasks")

    py_text = text if text is not None else _read(path)
    facts = _facts(py_text, path)
    stem = os.path.splitext(os.path.basename(path))[0]
    has_new = "ModelNew" in facts.classes

    if facts.is_reference():
        candidate = Candidate(source=py_text, kind="python") if has_new else None
        cu = os.path.splitext(path)[0] + ".cu"
        if not has_new and os.path.exists(cu) and (
            "ENTRY" in facts.constants or "kernel_forward" in facts.functions
        ):
            return _cuda_task(cu, _read(cu), path, py_text)
        return _task(stem, path, py_text, facts), candidate

    if has_new:
        tried = reference_candidates(path, facts)
        for ref in tried:
            if os.path.exists(ref) and os.path.abspath(ref) != os.path.abspath(path):
                ref_text = _read(ref)
                ref_facts = _facts(ref_text, ref)
                _require_reference(ref_facts, ref)
                ref_stem = os.path.splitext(os.path.basename(ref))[0]
                return _task(ref_stem, ref, ref_text, ref_facts), Candidate(source=py_text, kind="python")
        names = ", ".join(os.path.basename(t) for t in tried)
        raise TaskError(
            f"{os.path.basename(path)} defines ModelNew but no reference was found "
            f"(looked for {names}; or set REFERENCE = \"path.py\")"
        )

    if facts.names & set(REFERENCE_NAMES):
        _require_reference(facts, path)
    raise TaskError(
        f"{os.path.basename(path)} is not a Task: no class Model with get_inputs()/get_init_inputs() "
        "and no class ModelNew"
    )
