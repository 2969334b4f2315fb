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
