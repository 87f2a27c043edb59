"""Real redis-server processes for tests: started on a free loopback port
with no persistence (unless asked), stopped by PID. `redis_cluster` starts
several and joins them into a Redis Cluster of masters only."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import free_port


def wait_for_pong(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
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
def redis_server(workdir: str | os.PathLike[str], *args: str, port: int | None = None) -> Iterator[int]:
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


SLOTS = 16384


def redis_cli(port: int, *args: str) -> str:
    """One command through redis-cli (installed with redis-server); its answer."""
    binary = shutil.which("redis-cli")
    if binary is None:
        pytest.skip("redis-cli is not installed (apt-get install -y redis-server)")
    done = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True,
                          timeout=10, check=True)
    return done.stdout


@contextlib.contextmanager
def redis_cluster(workdir: str | os.PathLike[str], masters: int = 3, timeout_s: float = 30) -> Iterator[list[int]]:
    """A Redis Cluster of `masters` redis-servers on loopback, the slots
    split evenly among them (CLUSTER ADDSLOTSRANGE, then MEET); yields their
    ports once every node says cluster_state:ok and knows every other."""
    with contextlib.ExitStack() as stack:
        ports = []
        bus_port = free_port()  # given: the default, port + 10000, may be past 65535
        for i in range(masters):
            node_dir = Path(workdir) / f"node{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            ports.append(stack.enter_context(redis_server(
                node_dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus_port if i == 0 else free_port()), "--cluster-node-timeout", "5000")))
        for i, port in enumerate(ports):
            redis_cli(port, "CLUSTER", "ADDSLOTSRANGE", str(SLOTS * i // masters), str(SLOTS * (i + 1) // masters - 1))
        for port in ports[1:]:
            redis_cli(port, "CLUSTER", "MEET", "127.0.0.1", str(ports[0]), str(bus_port))
        deadline = time.monotonic() + timeout_s
        while not all(_cluster_ready(port, masters) for port in ports):
            if time.monotonic() > deadline:  # (a loaded machine's gossip may take its time: 30 s)
                views = "; ".join(f"{port}: {redis_cli(port, 'CLUSTER', 'NODES')!r}" for port in ports)
                pytest.fail(f"the Redis Cluster on ports {ports} did not reach cluster_state:ok in {timeout_s:.0f} s: "
                            f"{views}")
            time.sleep(0.05)
        yield ports


def _cluster_ready(port: int, masters: int) -> bool:
    info = dict(line.split(":", 1) for line in redis_cli(port, "CLUSTER", "INFO").split() if ":" in line)
    return info.get("cluster_state") == "ok" and info.get("cluster_known_nodes") == str(masters)
