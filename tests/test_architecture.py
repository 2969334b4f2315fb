"""The layers of docs/architecture.md, checked on the source: no import cycle among kernel_lsp
modules (imports inside functions count: a lazy import hides a cycle, it does not remove it),
and the LSP packages imported only by the server (and the `serve` path of the CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kernel_lsp"
LSP_PACKAGES = ("pygls", "lsprotocol")
# Where an LSP import may appear: the server package, and the CLI's `serve` entry point.
LSP_ALLOWED = ("kernel_lsp.server", "kernel_lsp.cli")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, outside `if TYPE_CHECKING:`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                walk_list(child.orelse)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                found.append((base, child.lineno))
                found.extend((f"{base}.{alias.name}", child.lineno) for alias in child.names)
            walk(child)

    def walk_list(nodes: list[ast.stmt]) -> None:
        for n in nodes:
            walk(ast.Module(body=[n], type_ignores=[]))

    walk(ast.parse(path.read_text(), filename=str(path)))
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, _ in imports(name, path):
            if target in mods and target != name and not name.startswith(target + "."):
                graph[name].add(target)  # a module importing its own package's __init__ is no cycle
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_kernel_lsp_modules():
    found = cycles(import_graph())
    assert not found, "import cycles (break them: move the shared part down a layer):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_lsp_packages_only_in_the_server():
    offenders = []
    for name, path in modules().items():
        if name.startswith(LSP_ALLOWED):
            continue
        for target, line in imports(name, path):
            if target.split(".")[0] in LSP_PACKAGES:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not offenders, "\n".join(offenders)


def test_cli_imports_the_server_only_to_serve():
    """The CLI's other commands must run without pygls (a GPU machine has none)."""
    mods = modules()
    for name, path in mods.items():
        if not name.startswith("kernel_lsp.cli"):
            continue
        tree = ast.parse(path.read_text())
        top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in top_level:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for imported in names:
                assert not imported.startswith(("kernel_lsp.server", *LSP_PACKAGES)), (
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {imported} at module level")


def test_worker_side_imports_no_lsp_or_tree_sitter():
    """The Worker (engine, toolchain) runs where only torch is installed."""
    offenders = []
    for name, path in modules().items():
        if not name.startswith(("kernel_lsp.engine", "kernel_lsp.toolchain")):
            continue
        for target, line in imports(name, path):
            root = target.split(".")[0]
            if root in (*LSP_PACKAGES, "tree_sitter", "openai") or target.startswith(
                    ("kernel_lsp.server", "kernel_lsp.source", "kernel_lsp.agent", "kernel_lsp.cli")):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not offenders, "\n".join(offenders)


# -- the engine's two rooms (docs/architecture.md): caller/ and worker/, protocol.py between --

CALLER = "kernel_lsp.engine.caller"
WORKER = "kernel_lsp.engine.worker"
SHARED = {"kernel_lsp.engine", "kernel_lsp.engine.protocol"}   # the package and the wire
FRONT_ENDS = ("kernel_lsp.server", "kernel_lsp.agent", "kernel_lsp.cli")


def import_time_imports(name: str, path: Path) -> list[tuple[str, int]]:
    """The imports that run when the module is imported: module level and class bodies, not
    function bodies (a lazy import there runs only when called), not `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy.update(id(n) for n in ast.walk(node) if n is not node)
    eager = {(n.lineno, type(n).__name__) for n in ast.walk(tree)
             if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in lazy}
    return [(t, line) for t, line in imports(name, path)
            if any(line == ln for ln, _ in eager)]


def _engine_module(target: str, mods: dict[str, Path]) -> str | None:
    """The kernel_lsp module an import names (`from pkg import module` names the module)."""
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def boundary_violations(mods: dict[str, Path]) -> list[str]:
    out = []
    for name, path in mods.items():
        rel = f"{name} ({path.name})"
        if name.startswith(CALLER):
            for target, line in import_time_imports(name, path):
                if target.split(".")[0] in ("torch", "triton") or target.startswith(WORKER):
                    out.append(f"{rel}:{line}: the caller side imports {target} at import time")
        if name.startswith(WORKER):
            for target, line in imports(name, path):
                if target.startswith((CALLER, *FRONT_ENDS)):
                    out.append(f"{rel}:{line}: the Worker side imports {target}")
    return out


def shared_engine_modules(mods: dict[str, Path]) -> set[str]:
    """kernel_lsp.engine modules imported (at any time) from both rooms."""
    seen: dict[str, set[str]] = {CALLER: set(), WORKER: set()}
    for name, path in mods.items():
        room = CALLER if name.startswith(CALLER) else WORKER if name.startswith(WORKER) else None
        if room is None:
            continue
        for target, _ in imports(name, path):
            mod = _engine_module(target, mods)
            if mod and mod.startswith("kernel_lsp.engine") and not mod.startswith(room):
                seen[room].add(mod)
            elif mod and mod in SHARED:
                seen[room].add(mod)
    both = {m for m in seen[CALLER] if not m.startswith((CALLER, WORKER))} & \
        {m for m in seen[WORKER] if not m.startswith((CALLER, WORKER))}
    return both | {m for m in seen[CALLER] if m.startswith(WORKER)} | {m for m in seen[WORKER] if m.startswith(CALLER)}


def test_the_engine_is_two_rooms_and_the_wire():
    engine = PACKAGE / "engine"
    loose = sorted(p.name for p in engine.glob("*.py") if p.name not in ("__init__.py", "protocol.py"))
    assert not loose, f"a module outside caller/ and worker/: {loose} (say which process it runs in)"
    assert (engine / "caller" / "__init__.py").exists() and (engine / "worker" / "__init__.py").exists()


def test_no_import_crosses_the_engine_boundary():
    found = boundary_violations(modules())
    assert not found, "\n".join(found)


def test_the_wire_protocol_is_all_the_two_rooms_share():
    assert shared_engine_modules(modules()) <= SHARED


def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        p = tmp_path / "kernel_lsp" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    out = {}
    for path in sorted((tmp_path / "kernel_lsp").rglob("*.py")):
        parts = list(path.relative_to(tmp_path).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


BASE = {"__init__.py": "", "engine/__init__.py": "", "engine/protocol.py": "",
        "engine/caller/__init__.py": "", "engine/worker/__init__.py": "", "engine/worker/judge/__init__.py": "",
        "engine/worker/judge/verify.py": "import torch\nfrom kernel_lsp.engine import protocol\n",
        "engine/caller/client.py": "from kernel_lsp.engine import protocol\n"
                                   "def later():\n    from kernel_lsp.engine.worker.judge import verify\n"}


def test_the_boundary_check_catches_a_planted_crossing(tmp_path):
    assert boundary_violations(_plant(tmp_path / "ok", BASE)) == []
    assert shared_engine_modules(_plant(tmp_path / "ok2", {**BASE, "engine/caller/client.py":
                                        "from kernel_lsp.engine import protocol\n"})) <= SHARED
    bad = _plant(tmp_path / "bad", {**BASE,
                 "engine/caller/pool.py": "import torch\nfrom kernel_lsp.engine.worker.judge import verify\n",
                 "engine/worker/run.py": "def f():\n    from kernel_lsp.engine.caller import client\n"
                                         "from kernel_lsp.server import app\n"})
    found = "\n".join(boundary_violations(bad))
    assert "caller side imports torch" in found and "caller side imports kernel_lsp.engine.worker" in found
    assert "Worker side imports kernel_lsp.engine.caller" in found        # even from a function
    assert "Worker side imports kernel_lsp.server" in found
    shared = shared_engine_modules(_plant(tmp_path / "both", {**BASE,
                                   "engine/options.py": "", "engine/caller/client.py": "import kernel_lsp.engine.options\n",
                                   "engine/worker/judge/verify.py": "from kernel_lsp.engine import options\n"}))
    assert shared == {"kernel_lsp.engine.options"}
