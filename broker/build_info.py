"""Which build of hourglass runs: its version, and which of its modules are
mypyc-compiled extensions rather than the Python sources
(`hourglass --version`; docs/dependencies.md, "mypyc").

The answer is read from the installed files, not from a list kept beside
setup.py's: a module is compiled when an extension module of its name lies
in its folder, since the import system loads an extension before a `.py`
of the same name. Nothing is imported but the four packages themselves.

    >>> describe()                       # an editable or plain install
    'hourglass 0.1.0 (pure Python)'
    >>> describe()                       # HOURGLASS_MYPYC=1 pip install .
    'hourglass 0.1.0 (mypyc: storage 27/32 modules, wheel 8/9 modules, broker 25/69 modules)'
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import os
from dataclasses import dataclass

PACKAGES = ("storage", "wheel", "replication", "broker")


@dataclass(frozen=True)
class PackageBuild:
    """One package's modules (its __init__ and subpackages' modules
    included), and which of them are compiled."""

    package: str
    modules: tuple[str, ...]
    compiled: tuple[str, ...]


def package_build(package: str) -> PackageBuild:
    """Every module under `package` (a `.py` file or an extension module in
    its folder or a subfolder), and those that are extension modules."""
    root = os.path.dirname(importlib.import_module(package).__file__ or "")
    extensions = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    modules: set[str] = set()
    compiled: set[str] = set()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name != "__pycache__"]
        relative = os.path.relpath(folder, root)
        prefix = package if relative == "." else ".".join([package, *relative.split(os.sep)])
        for name in files:
            stem = next((name.removesuffix(suffix) for suffix in (*extensions, ".py") if name.endswith(suffix)), None)
            if stem is None:
                continue
            module = prefix if stem == "__init__" else f"{prefix}.{stem}"
            modules.add(module)
            if name.endswith(extensions):
                compiled.add(module)
    return PackageBuild(package, tuple(sorted(modules)), tuple(sorted(compiled)))


def version() -> str:
    """The installed distribution's version ("unknown" when the sources run
    without being installed, e.g. on PYTHONPATH)."""
    try:
        return importlib.metadata.version("hourglass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def describe() -> str:
    """One line: the version, then "pure Python" or, per package with
    compiled modules, how many of its modules are compiled."""
    builds = [package_build(package) for package in PACKAGES]
    compiled = [f"{b.package} {len(b.compiled)}/{len(b.modules)} modules" for b in builds if b.compiled]
    return f"hourglass {version()} ({'mypyc: ' + ', '.join(compiled) if compiled else 'pure Python'})"
