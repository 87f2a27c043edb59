"""The top-level `wheel` package must not break building or installing."""

import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest
from harness import Process, Server, free_port

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


def _warnings(output: str) -> list[str]:
    """The lines of a build's output that warn (setuptools', mypyc's, the
    compiler's), not gcc's `-Wno-...-warning-option` flags."""
    return [line for line in output.splitlines() if re.search(r"(?i)warning:|deprecat", line)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_python_m_build_makes_an_sdist_and_a_wheel_without_a_warning_and_the_wheel_serves(tmp_path):
    """README, "Installing from a wheel": `python -m build`, then the wheel
    into a fresh venv, whose `hourglass serve` answers a send. Pure Python
    here (HOURGLASS_MYPYC=0: the packaging, not the compile; .ci/run builds
    the compiled one); PYTHONDONTWRITEBYTECODE, where set, would have
    setuptools say it skips byte-compiling, which a wheel never holds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"HOURGLASS_MYPYC": "0"}
    if subprocess.run([sys.executable, "-m", "build", "--version"], cwd=tmp_path, capture_output=True).returncode:
        pytest.skip("PyPA's build is not installed (the dev extra has it: pip install build)")
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), ROOT], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert _warnings(built.stdout + built.stderr) == []
    assert sorted(os.listdir(dist)) == ["hourglass-0.1.0-py3-none-any.whl", "hourglass-0.1.0.tar.gz"]
    with tarfile.open(dist / "hourglass-0.1.0.tar.gz") as sdist:
        names = set(sdist.getnames())
    assert {"hourglass-0.1.0/setup.py", "hourglass-0.1.0/build_backend/hourglass_build.py",
            "hourglass-0.1.0/deploy/grafana/hourglass.json", "hourglass-0.1.0/deploy/prometheus/hourglass-rules.yml",
            "hourglass-0.1.0/broker/redis/lua/rmq/common.lua"} <= names

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(dist / "hourglass-0.1.0-py3-none-any.whl")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "hourglass"), "--version"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert version.stdout.startswith("hourglass 0.1.0 (pure Python)"), version.stdout + version.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import broker; print(broker.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60).stdout
    assert where.startswith(str(venv)), where  # the installed copy, not the sources

    port = free_port()
    process = Process([str(venv / "bin" / "hourglass"), "serve", "--data-dir", str(tmp_path / "data"), "--port",
                       str(port)], tmp_path / "serve.log", cwd=str(tmp_path))
    server = Server(process, f"http://127.0.0.1:{port}", str(tmp_path / "data"))
    try:
        server.wait_healthy()
        status, body = server.post("sendMsg", topic="t", msg="from the wheel", msgId="w1")
        assert status == 200, body
        status, body = server.post("getMsg", topic="t", msgId="w1")
        assert status == 200 and body["delayMsg"]["msg"] == "from the wheel"
        assert server.stop() == 0
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.sources("builds the compiled wheel from this tree: a run that imports an installed build skips it")
@pytest.mark.timeout(900)
def test_the_compiled_wheel_builds_without_a_warning(tmp_path, monkeypatch):
    """What the README's `python -m build` makes by default where a C
    compiler exists: the mypyc build, with no warning from setuptools,
    mypyc or the compiler. Once, in the sources' run (the compiled run of
    `bash .ci/run` has the same tree installed)."""
    import broker

    if not os.path.abspath(broker.__file__).startswith(ROOT + os.sep):
        pytest.skip("the sources' run builds it (this run tests an installed build)")
    monkeypatch.syspath_prepend(os.path.join(ROOT, "build_backend"))
    import hourglass_build
    if not hourglass_build.can_compile():
        pytest.skip("no C compiler or Python headers here: the build would be pure Python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"HOURGLASS_MYPYC": "1"}
    if subprocess.run([sys.executable, "-m", "build", "--version"], cwd=tmp_path, capture_output=True).returncode:
        pytest.skip("PyPA's build is not installed (the dev extra has it: pip install build)")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), ROOT],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert _warnings(built.stdout + built.stderr) == []
    (wheel_name,) = os.listdir(tmp_path / "dist")
    names = zipfile.ZipFile(tmp_path / "dist" / wheel_name).namelist()
    assert any(n.startswith("storage/") and n.endswith(".so") for n in names), wheel_name
