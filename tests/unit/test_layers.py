"""The layers import one way: storage <- wheel <- replication <- broker.

Every import in every module, at the top or inside a function (where one
would hide to dodge a cycle), is read from the source with `ast`. Relative
imports stay inside their own package, so only absolute ones can cross.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("storage", "wheel", "replication", "broker")  # each may import only those before it


def imported_packages(source: str) -> set[tuple[str, int]]:
    """(top-level package, line) of every absolute import in `source`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def test_every_layer_imports_only_the_layers_beneath_it():
    offenders = []
    for rank, layer in enumerate(LAYERS):
        above = set(LAYERS[rank + 1:])
        modules = sorted((ROOT / layer).rglob("*.py"))
        assert modules, layer
        for path in modules:
            for package, line in sorted(imported_packages(path.read_text())):
                if package in above:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} imports {package}")
    assert offenders == []


def test_no_layer_imports_the_tests_helpers():
    """What tests/ holds beside the suites (the reference `InMemoryStore`,
    harnesses) is on pytest's path only: the product never leans on it."""
    helpers = {path.stem for path in (ROOT / "tests").glob("*.py")} | {"tests"}
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {package}"
                 for layer in LAYERS for path in sorted((ROOT / layer).rglob("*.py"))
                 for package, line in sorted(imported_packages(path.read_text())) if package in helpers]
    assert "memory_store" in helpers
    assert offenders == []


def test_the_check_sees_imports_inside_functions_and_every_form():
    source = ("import os, wheel.clock\n"
              "def late():\n    from broker import api\n"
              "class C:\n    import replication.config as c\n"
              "from . import sibling\n")
    assert imported_packages(source) == {("os", 1), ("wheel", 1), ("broker", 3), ("replication", 5)}


def test_a_standalone_node_loads_none_of_the_clusters_modules():
    """broker.node.server imports the cluster (and with it aiohttp's client,
    about 0.3 s of start-up) only to run a cluster node, and the cluster
    node loads pysyncobj and cryptography (about 6 MB) only to build its
    Raft election; a standalone or Redis node loads none of them."""
    import subprocess
    import sys

    code = ("import sys, broker.cli, broker.node.server; "
            "print(sorted(m for m in ('aiohttp', 'broker.cluster', 'pysyncobj', 'cryptography') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def broker_room(module: str) -> str:
    """The room of a module of broker/: its folder (broker.disk...), or the
    module itself for a file at broker/'s top (broker.backend...)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def broker_imports(path: pathlib.Path, top: str = "broker") -> set[str]:
    """Every module or package of `top` that `path` imports, relative imports resolved."""
    relative = path.relative_to(ROOT).with_suffix("")
    package = list(relative.parts[:-1])  # a module's folder, or an __init__'s own
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == top)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module.split(".")[0] != top:
                continue
            if module == top or (node.level and not node.module):
                found.update(f"{module}.{alias.name}" for alias in node.names)
            else:
                found.add(module)
    return found


def in_circles(arrows: dict[str, set[str]]) -> list[str]:
    """The nodes of `arrows` (node -> the nodes it imports) that import
    themselves through any others."""
    found = []
    for start in arrows:
        seen, todo = set(), list(arrows[start])
        while todo:
            other = todo.pop()
            if other not in seen:
                seen.add(other)
                todo.extend(arrows.get(other, ()))
        if start in seen:
            found.append(start)
    return found


def test_the_rooms_of_broker_import_one_way():
    """broker/'s rooms (docs/internals.md, "Where the code is": each
    folder, and each file at its top) import one way: no two of them,
    through any others, import each other."""
    arrows: dict[str, set[str]] = {}
    for path in sorted((ROOT / "broker").rglob("*.py")):
        room = broker_room(".".join(path.relative_to(ROOT).with_suffix("").parts))
        arrows.setdefault(room, set()).update(
            broker_room(module) for module in broker_imports(path) if broker_room(module) not in (room, "broker"))
    assert "broker.disk" in arrows and "broker.http" in arrows["broker.console"]
    assert in_circles(arrows) == []


def test_no_module_imports_itself_through_others_not_even_for_type_checking():
    """Within each layer, no module imports (through any others) a module
    that imports it, counting the imports under `if TYPE_CHECKING:` and
    inside functions: a part that needs another's methods names them in a
    Protocol of its own (broker.disk.windows.MessageSteps,
    broker.shards.rates.Links). A module's import of its own package
    (the __init__ above it) is not counted."""
    circles = []
    for top in LAYERS:
        modules = {}
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
        arrows: dict[str, set[str]] = {}
        for name, path in modules.items():
            arrows[name] = set()
            for module in broker_imports(path, top):
                while module and module not in modules:  # a name imported from a module: the module
                    module = module.rpartition(".")[0]
                if module and module != name and not name.startswith(module + "."):
                    arrows[name].add(module)
        circles += in_circles(arrows)
    assert circles == []
