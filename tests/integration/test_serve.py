"""A real `hourglass serve` process on 127.0.0.1: health, metrics, auth,
graceful stop."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start(tmp_path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", "--port", str(port),
                                 "--data-dir", str(tmp_path / "data"), *flags],
                                stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if get(base + "/health")[0] == 200:
                return proc, base
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"serve did not come up: {log_path.read_text()}")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_health_metrics_and_graceful_stop(tmp_path):
    proc, base = start(tmp_path)
    status, body = get(base + "/health")
    assert status == 200
    assert json.loads(body) == {"code": 200, "msg": "success", "status": "ok", "role": "standalone",
                                "leader": None, "node": None}
    status, body = get(base + "/metrics")
    assert status == 200 and b"hourglass_hours 0" in body
    assert stop(proc) == 0
    assert os.path.exists(tmp_path / "data" / "checkpoint")


def test_auth_token_guards_everything_but_health(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    proc, base = start(tmp_path, "--auth-token-file", str(token_file))
    try:
        assert get(base + "/health")[0] == 200
        status, body = get(base + "/metrics")
        assert status == 401 and json.loads(body)["code"] == 401
        assert get(base + "/metrics", token="wrong")[0] == 401
        assert get(base + "/metrics", token="s3cret")[0] == 200
    finally:
        assert stop(proc) == 0


def test_unknown_backend_is_refused_with_a_sentence(tmp_path):
    result = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--backend", "redis://127.0.0.1:1/0",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--backend" in result.stderr
