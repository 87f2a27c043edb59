"""hourglass's build backend: setuptools' own, plus the mypyc build.

`HOURGLASS_MYPYC` chooses what a wheel (a non-editable install) holds:

    unset or "auto"  the modules setup.py lists compiled by mypyc where this
                     machine can compile them (a C compiler and Python's
                     headers); pure Python otherwise, saying so in one line
    "1"              compiled, or the build fails (no silent pure wheel)
    "0"              pure Python

Compiling asks for mypy (which brings mypyc) and the runtime dependencies
(for their types) in the build environment; the backend settles the
choice once and hands it to setup.py as HOURGLASS_MYPYC=1 or 0. An
editable install is always pure Python (its modules must follow later
edits of the sources); with "1" it is refused, naming the command to use.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tomllib

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the hooks kept as they are)
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_wheel,
)

# mypyc ships inside mypy; the same floor as the dev extra's type checker
MYPYC_REQUIREMENT = "mypy>=1.10"


class CompiledEditableRefused(RuntimeError):
    """HOURGLASS_MYPYC=1 with an editable install: compiled modules would
    not follow later edits of the sources."""


class MypycMissing(RuntimeError):
    """HOURGLASS_MYPYC=1 in a build environment without mypyc (pip's
    --no-build-isolation without mypy installed): the wheel would silently
    be pure Python."""


def _mode() -> str:
    """HOURGLASS_MYPYC as "auto", "1" or "0" (anything else: "auto")."""
    value = os.environ.get("HOURGLASS_MYPYC", "").strip().lower()
    return value if value in ("1", "0") else "auto"


def can_compile() -> bool:
    """A C compiler and Python's headers are here (what mypyc's extensions need)."""
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which(compiler) is not None and os.path.exists(headers)


def _mypyc_requested() -> bool:
    """Whether this wheel is compiled; settled once, and handed to setup.py."""
    mode = _mode()
    if mode == "auto":
        mode = "1" if can_compile() else "0"
        if mode == "0":
            print("hourglass: no C compiler or Python headers (Debian: build-essential python3-dev): installing "
                  "the pure-Python build, which takes more CPU a request (docs/dependencies.md, mypyc)",
                  file=sys.stderr)
    os.environ["HOURGLASS_MYPYC"] = mode
    return mode == "1"


def _refuse_compiled_editable() -> None:
    if _mode() == "1":
        raise CompiledEditableRefused(
            "HOURGLASS_MYPYC=1 builds a compiled wheel, which an editable install (-e) cannot use: its compiled "
            "modules would not follow later edits. Install with `HOURGLASS_MYPYC=1 pip install .`, or unset "
            "HOURGLASS_MYPYC for the pure-Python editable install.")
    os.environ["HOURGLASS_MYPYC"] = "0"  # (editable: pure Python, whatever this machine can compile)


def _runtime_dependencies() -> list[str]:
    """pyproject.toml's [project] dependencies: mypyc type-checks the
    modules it compiles as `mypy` does, so the packages they import must be
    in the build environment too (orjson's and httptools' types, ...)."""
    with open("pyproject.toml", "rb") as f:
        dependencies: list[str] = tomllib.load(f)["project"]["dependencies"]
    return dependencies


def get_requires_for_build_wheel(config_settings: dict[str, str | list[str]] | None = None) -> list[str]:
    requires: list[str] = _setuptools.get_requires_for_build_wheel(config_settings)
    if not _mypyc_requested():
        return requires
    return [*requires, MYPYC_REQUIREMENT, *_runtime_dependencies()]


def build_wheel(wheel_directory: str, config_settings: dict[str, str | list[str]] | None = None,
                metadata_directory: str | None = None) -> str:
    chosen = _mode() == "1"
    if _mypyc_requested():
        try:
            import mypyc.build  # noqa: F401
        except ImportError as e:
            if chosen:
                raise MypycMissing(f"HOURGLASS_MYPYC=1 needs mypyc in the build environment "
                                   f"({MYPYC_REQUIREMENT}): {e}") from e
            return _pure_wheel(f"mypyc is not in the build environment ({e})", wheel_directory, config_settings,
                               metadata_directory)
        try:
            compiled: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
        except (Exception, SystemExit) as e:  # (setuptools reports a failed compiler as SystemExit)
            if chosen:
                raise
            return _pure_wheel(f"compiling failed ({e})", wheel_directory, config_settings, metadata_directory)
        return compiled
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def _pure_wheel(why: str, wheel_directory: str, config_settings: dict[str, str | list[str]] | None,
                metadata_directory: str | None) -> str:
    """The pure-Python wheel, after one line saying why it is not compiled."""
    print(f"hourglass: {why}: installing the pure-Python build, which takes more CPU a request "
          f"(docs/dependencies.md, mypyc)", file=sys.stderr)
    os.environ["HOURGLASS_MYPYC"] = "0"
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def get_requires_for_build_editable(config_settings: dict[str, str | list[str]] | None = None) -> list[str]:
    _refuse_compiled_editable()
    requires: list[str] = _setuptools.get_requires_for_build_editable(config_settings)
    return requires


def prepare_metadata_for_build_editable(metadata_directory: str,
                                        config_settings: dict[str, str | list[str]] | None = None) -> str:
    _refuse_compiled_editable()
    name: str = _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)
    return name


def build_editable(wheel_directory: str, config_settings: dict[str, str | list[str]] | None = None,
                   metadata_directory: str | None = None) -> str:
    _refuse_compiled_editable()
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    return name
