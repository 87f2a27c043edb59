"""A real `hourglass serve` process on 127.0.0.1: health, metrics, auth,
graceful stop."""

import os
import subprocess
import sys

import pytest
from serving import Server

pytestmark = pytest.mark.slow


def test_health_metrics_and_graceful_stop(tmp_path):
    server = Server.start(tmp_path / "data")
    status, body = server.get("/health")
    assert status == 200
    assert body == {"code": 200, "msg": "success", "status": "ok", "role": "standalone",
                    "leader": None, "node": None}
    status, body = server.get("/metrics")
    assert status == 200 and b"hourglass_hours 0" in body
    assert server.stop() == 0
    assert os.path.exists(tmp_path / "data" / "checkpoint")


def test_auth_token_guards_everything_but_health(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)  # readable by others: refused (--allow-readable-token)
    server = Server.start(tmp_path / "data", "--auth-token-file", str(token_file))
    try:
        assert server.get("/health")[0] == 200
        status, body = server.get("/metrics")
        assert status == 401 and body["code"] == 401
        server.token = "wrong"
        assert server.get("/metrics")[0] == 401
        server.token = "s3cret-token-0123456789"
        assert server.get("/metrics")[0] == 200
    finally:
        assert server.stop() == 0


def test_unknown_backend_is_refused_with_a_sentence(tmp_path):
    result = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--backend", "memcached://127.0.0.1:1",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--backend" in result.stderr


def test_a_token_that_is_not_utf8_is_401(tmp_path):
    import socket
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)  # readable by others: refused (--allow-readable-token)
    server = Server.start(tmp_path / "data", "--auth-token-file", str(token_file))
    try:
        host, port = server.base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n")
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:80]
    finally:
        assert server.stop() == 0
