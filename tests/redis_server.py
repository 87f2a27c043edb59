"""Real redis-server processes for tests: started on a free loopback port
with no persistence (unless asked), stopped by PID."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_pong(port: int, proc: subprocess.Popen, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
            if reply.startswith((b"+PONG", b"-NOAUTH")):
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"redis-server did not start on port {port} (exit {proc.poll()})")
        time.sleep(0.05)


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    return binary


@contextlib.contextmanager
def redis_server(workdir, *args: str, port: int | None = None) -> Iterator[int]:
    """Run one redis-server in `workdir`; yields its port. Extra `args` are
    passed on (e.g. "--requirepass", "secret" or "--cluster-enabled", "yes")."""
    port = port or free_port()
    proc = subprocess.Popen([redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir), *args],
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_pong(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
