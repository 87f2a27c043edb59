"""The top-level `wheel` package must not break building or installing."""

import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_wheel_is_ours():
    """The sources' wheel/, or the installed copy of it (the compiled run
    of `bash .ci/run` tests an installed wheel): never PyPA's."""
    import wheel

    folder = os.path.dirname(os.path.abspath(wheel.__file__))
    assert os.path.exists(os.path.join(folder, "timing_wheel.py"))
    assert not os.path.exists(os.path.join(folder, "bdist_wheel.py"))


@pytest.mark.slow
def test_pip_builds_a_wheel_of_hourglass(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), ROOT],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "HOURGLASS_MYPYC": "0"},  # the packaging, not the compile (.ci/run checks that)
    )
    assert result.returncode == 0, result.stderr
    (built,) = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    names = zipfile.ZipFile(tmp_path / built).namelist()
    for package in ("broker", "storage", "wheel", "replication"):
        assert f"{package}/__init__.py" in names
    assert "broker/redis/__init__.py" in names
    lua = {"backend", "dyno", "rmq"}
    assert {name.split("/")[3] for name in names if name.startswith("broker/redis/lua/") and name.endswith("/common.lua")} == lua
