"""Which submodules a line of a model file stands for (plain `ast`, no execution): for the
editor's hot-op action, which hands the name to `whole_model.optimize_op`."""

from __future__ import annotations

from typing import Any


def _class_graph(tree: Any) -> tuple[dict[str, dict[str, str]], dict[str, Any]]:
    """Per class of the file: its `self.<attr> = <Class>(...)` submodules, and the class nodes."""
    import ast

    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    children: dict[str, dict[str, str]] = {}
    for name, node in classes.items():
        kids: dict[str, str] = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
                func = sub.value.func
                callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                for t in sub.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        kids[t.attr] = callee
        children[name] = kids
    return children, classes


def ops_at(source: str, line: int, root: str = "Model") -> list[str]:
    """The submodule names (as `optimize_op` takes them) that a 0-based `line` of a model file
    stands for: `self.fc(...)` calls (outermost first) or a `self.fc = ...` assignment give those
    submodules; any other line inside a module class gives that module (every place `root`
    builds it). Plain `ast`, no execution; [] when the line is in no module of `root`."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    children, classes = _class_graph(tree)

    def paths(cls: str, prefix: str = "", seen: tuple[str, ...] = ()) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {cls: [prefix]}
        for attr, sub in children.get(cls, {}).items():
            if sub in classes and sub not in seen:
                for k, v in paths(sub, f"{prefix}.{attr}" if prefix else attr, seen + (cls,)).items():
                    out.setdefault(k, []).extend(v)
            elif sub:  # a torch.nn module or one from elsewhere: a leaf here
                out.setdefault(f"{cls}.{attr}", []).append(f"{prefix}.{attr}" if prefix else attr)
        return out

    if root not in classes:
        return []
    where = paths(root)
    lineno = line + 1
    for name, node in classes.items():
        if not (node.lineno <= lineno <= (node.end_lineno or node.lineno)) or name not in where:
            continue
        found: list[str] = []
        for sub in ast.walk(node):  # outermost first: `self.a(self.b(x))` gives a, then b
            if getattr(sub, "lineno", None) != lineno:
                continue
            attr = None
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                    and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "self":
                attr = sub.func.attr
            elif isinstance(sub, ast.Assign):
                attr = next((t.attr for t in sub.targets if isinstance(t, ast.Attribute)
                             and isinstance(t.value, ast.Name) and t.value.id == "self"), None)
            if attr is None or attr not in children.get(name, {}):
                continue
            sub_cls = children[name][attr]
            hits = where.get(sub_cls, []) if sub_cls in classes else where.get(f"{name}.{attr}", [])
            mine = [f"{p}.{attr}" if p else attr for p in where[name]]
            found += [h for h in hits if h in mine and h not in found] or [m for m in mine if m not in found]
        return found or [p for p in where[name] if p]
    return []
