"""Which build runs (broker/build_info.py, `hourglass --version`), and the
rules that keep a compiled module from ever running stale: no extension
module in the source tree, no compiled editable install."""

import importlib.machinery
import os
import re
import subprocess
import sys

import pytest

import storage.placement
from broker.build_info import describe, package_build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTENSION = importlib.machinery.EXTENSION_SUFFIXES[0]


def running_compiled() -> bool:
    """Whether this process runs the compiled build (storage.placement is
    one of setup.py's COMPILED modules)."""
    return storage.placement.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_version_says_whether_compiled_modules_run():
    result = subprocess.run([sys.executable, "-m", "broker.cli", "--version"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert re.fullmatch(r"hourglass \S+ \((pure Python|mypyc: .+)\)", line), line
    assert line == describe()
    if running_compiled():
        assert re.search(r"storage \d+/\d+ modules", line), line
    else:
        assert line.endswith("(pure Python)")


def test_package_build_counts_extension_modules_as_compiled(tmp_path, monkeypatch):
    package = tmp_path / "hg_build_probe"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py", "notes.txt"):
        (package / name).write_text("")
    (package / f"a{EXTENSION}").write_bytes(b"")  # found before a.py by the import system
    (package / "sub" / f"d{EXTENSION}").write_bytes(b"")  # compiled, no source beside it
    monkeypatch.syspath_prepend(str(tmp_path))
    build = package_build("hg_build_probe")
    assert build.modules == ("hg_build_probe", "hg_build_probe.a", "hg_build_probe.b", "hg_build_probe.sub",
                             "hg_build_probe.sub.c", "hg_build_probe.sub.d")
    assert build.compiled == ("hg_build_probe.a", "hg_build_probe.sub.d")


def test_the_source_tree_holds_no_extension_module():
    """Compiled modules live only in a wheel built with HOURGLASS_MYPYC=1:
    one beside its source would be loaded instead of the source, however
    the source changed since."""
    found = []
    for package in ("storage", "wheel", "replication", "broker"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            found += [os.path.join(folder, name) for name in files
                      if name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]
    assert found == []


def test_a_compiled_editable_install_is_refused(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "build_backend"))
    import hourglass_build

    monkeypatch.setenv("HOURGLASS_MYPYC", "1")
    with pytest.raises(hourglass_build.CompiledEditableRefused, match=r"pip install \."):
        hourglass_build.get_requires_for_build_editable()
    with pytest.raises(hourglass_build.CompiledEditableRefused):
        hourglass_build.build_editable("unused")


def _backend(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "build_backend"))
    import hourglass_build
    return hourglass_build


def test_by_default_a_wheel_is_compiled_where_this_machine_can_compile(monkeypatch):
    backend = _backend(monkeypatch)
    monkeypatch.setenv("HOURGLASS_MYPYC", "auto")  # (setenv: monkeypatch puts it back, whatever the backend sets)
    monkeypatch.setattr(backend, "can_compile", lambda: True)
    assert backend._mypyc_requested()
    assert os.environ["HOURGLASS_MYPYC"] == "1"  # what setup.py reads


def test_by_default_a_wheel_is_pure_python_with_one_line_where_nothing_compiles(monkeypatch, capsys):
    backend = _backend(monkeypatch)
    monkeypatch.setenv("HOURGLASS_MYPYC", "auto")
    monkeypatch.setattr(backend, "can_compile", lambda: False)
    assert not backend._mypyc_requested()
    assert os.environ["HOURGLASS_MYPYC"] == "0"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pure-Python build" in err and "build-essential python3-dev" in err


def test_zero_asks_for_pure_python_and_an_editable_install_is_pure_python(monkeypatch):
    backend = _backend(monkeypatch)
    monkeypatch.setattr(backend, "can_compile", lambda: True)
    monkeypatch.setenv("HOURGLASS_MYPYC", "0")
    assert not backend._mypyc_requested()
    monkeypatch.delenv("HOURGLASS_MYPYC")
    backend._refuse_compiled_editable()  # auto: no refusal, and pure Python
    assert os.environ["HOURGLASS_MYPYC"] == "0"


def test_this_machine_can_compile_when_it_has_a_compiler_and_the_headers(monkeypatch, tmp_path):
    backend = _backend(monkeypatch)
    include = tmp_path / "include"
    include.mkdir()
    monkeypatch.setattr(backend.sysconfig, "get_paths", lambda: {"include": str(include)})
    monkeypatch.setattr(backend.sysconfig, "get_config_var", lambda name: "no-such-compiler-here -pthread")
    assert not backend.can_compile()
    monkeypatch.setattr(backend.sysconfig, "get_config_var", lambda name: "sh")  # a program that exists
    assert not backend.can_compile()  # no Python.h yet
    (include / "Python.h").write_text("")
    assert backend.can_compile()
