"""hourglass's build backend: setuptools' own, plus the opt-in mypyc build.

Without `HOURGLASS_MYPYC=1` every hook is setuptools.build_meta's, and the
package is pure Python (no C compiler needed: the README's set-up command).
With it, building a wheel asks for mypy (which brings mypyc) and the
runtime dependencies (for their types) in the build environment, and
setup.py compiles the modules it lists; building for an
editable install is refused, since compiled modules are a snapshot of the
sources and an editable install must always run the sources as they are.
"""

from __future__ import annotations

import os
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


def _mypyc_requested() -> bool:
    return os.environ.get("HOURGLASS_MYPYC", "") == "1"


def _refuse_compiled_editable() -> None:
    if _mypyc_requested():
        raise CompiledEditableRefused(
            "HOURGLASS_MYPYC=1 builds a compiled wheel, which an editable install (-e) cannot use: its compiled "
            "modules would not follow later edits. Install with `HOURGLASS_MYPYC=1 pip install .`, or unset "
            "HOURGLASS_MYPYC for the pure-Python editable install.")


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
    if _mypyc_requested():
        try:
            import mypyc.build  # noqa: F401
        except ImportError as e:
            raise MypycMissing(f"HOURGLASS_MYPYC=1 needs mypyc in the build environment ({MYPYC_REQUIREMENT}): "
                               f"{e}") from e
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
