"""One writer per field of a cluster node's state (broker.cluster.state's
`NodeState`, and the `Follower` it holds, replication.log_stream): each
field is assigned by one part only, the others read it or ask that part
(docs/internals.md, "Cluster node state"). A structural test: it reads
the sources, as the rule is about where the code that changes a field is.

What counts as a write: an assignment (plain, augmented, annotated, or
one target of a tuple) to `state.F`, `self.state.F`, `node.state.F`, or
`self.F` in the class itself, outside its __init__ (which builds it); for
the Follower, `follower.F`, `state.follower.F`, `self.F` in `Follower`."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "broker" / "cluster").glob("*.py")), ROOT / "replication" / "log_stream.py"]

# (class, what names an instance of it outside the class)
OWNED = {"NodeState": "state", "Follower": "follower"}


def _fields(tree: ast.Module, cls: str) -> set[str]:
    """The fields `cls`'s __init__ sets on self."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            return {t.attr for t in _targets(init) if isinstance(t.value, ast.Name) and t.value.id == "self"}
    raise AssertionError(f"no class {cls}")


def _targets(node: ast.AST) -> list[ast.Attribute]:
    """The attributes assigned anywhere under `node`."""
    out: list[ast.Attribute] = []

    def add(target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                add(t)
        elif isinstance(target, ast.Attribute):
            out.append(target)

    for n in ast.walk(node):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                add(t)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            add(n.target)
    return out


def _names(value: ast.expr, name: str) -> bool:
    """`value` is `name` or `X.name` (state, self.state, node.state)."""
    return (isinstance(value, ast.Name) and value.id == name) or (isinstance(value, ast.Attribute)
                                                                  and value.attr == name)


def writers() -> dict[tuple[str, str], set[str]]:
    """(class, field) -> the modules (and, in its own module, the class)
    that assign it."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in SOURCES}
    fields = {cls: _fields(trees[path], cls) for cls in OWNED for path in trees
              if any(isinstance(n, ast.ClassDef) and n.name == cls for n in ast.walk(trees[path]))}
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path, tree in trees.items():
        module = path.relative_to(ROOT).as_posix()
        own_methods: list[tuple[str, ast.AST]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in OWNED:
                own_methods += [(node.name, f) for f in node.body
                                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name != "__init__"]
        for cls, method in own_methods:
            for t in _targets(method):
                if isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr in fields[cls]:
                    found[(cls, t.attr)].add(module)
        for t in _targets(tree):
            for cls, name in OWNED.items():
                if _names(t.value, name) and t.attr in fields[cls]:
                    found[(cls, t.attr)].add(module)
    return found


def test_the_fields_are_found() -> None:
    """The walk sees the writes it is meant to (a test that found none would pass)."""
    found = writers()
    assert ("NodeState", "store") in found and ("NodeState", "roles") in found
    assert ("Follower", "last_tick") in found


def test_each_field_of_a_nodes_state_has_one_writer() -> None:
    shared = {f"{cls}.{field}": sorted(modules) for (cls, field), modules in writers().items() if len(modules) > 1}
    assert shared == {}
