"""Single sends from a few keep-alive clients: the lightest load that
shows a send's own cost. A `hourglass serve --fsync batch` child (a fresh
data directory, a free port on 127.0.0.1, stopped by PID at the end) and
--clients processes, each one raw keep-alive socket sending sendMsg one at
a time (100-byte payloads, 10 min ahead) for --seconds after a 1 s warm-up.
Prints ONE JSON object: the rate, and the server's own CPU per request
from /proc (user and system, and the split between its threads).

    .venv/bin/python bench/single_sends.py
    .venv/bin/python bench/single_sends.py --clients 4 --seconds 8
    .venv/bin/python bench/single_sends.py --root /path/to/another/checkout   # its broker, this interpreter
    .venv/bin/python bench/single_sends.py --python .venv/bin/python          # the installed build
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time

from harness import HOST, ROOT, free_port, request, wait_until

PREFIX = "/camellia/delayQueue/"


def client(port: int, seconds: float, n: int, done: multiprocessing.Queue) -> None:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    end = time.monotonic() + seconds
    count = 0
    while time.monotonic() < end:
        count += 1
        body = f"topic=t&msg={'x' * 100}&msgId=c{n}-{count}-{time.time_ns()}&delayMillis=600000".encode()
        sock.sendall(b"POST %ssendMsg HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (PREFIX.encode(), HOST.encode(), len(body), body))
        answer = b""
        while True:
            answer += sock.recv(65536)
            head = answer.find(b"\r\n\r\n")
            if head < 0:
                continue
            length = next(int(line.split(b":")[1]) for line in answer[:head].split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            if len(answer) >= head + 4 + length:
                break
        if b'"code":200' not in answer:
            raise RuntimeError(answer[:200])
    done.put(count)


def load(port: int, seconds: float, clients: int) -> int:
    done: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=client, args=(port, seconds, n, done)) for n in range(clients)]
    for p in procs:
        p.start()
    total = sum(done.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    return total


def cpu_ticks(pid: int) -> dict[str, tuple[int, int]]:
    """(user, system) clock ticks of each thread of `pid`: "loop" (the main
    thread, the event loop's), the others by thread id (the syncer's)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["loop" if int(tid) == pid else f"thread {tid}"] = (int(fields[11]), int(fields[12]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--root", default=ROOT, help="the source tree whose broker runs (default: this one)")
    p.add_argument("--python", default=None, help="an interpreter whose installed hourglass runs, from outside "
                                                  "any source tree (overrides --root)")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="hourglass-single-")
    port = free_port()
    command = [a.python or sys.executable, "-m", "broker.cli", "serve", "--data-dir", os.path.join(work, "data"),
               "--host", HOST, "--port", str(port), "--fsync", "batch"]
    with open(os.path.join(work, "server.log"), "wb") as log:
        server = subprocess.Popen(command, cwd=work if a.python else a.root, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: request(f"http://{HOST}:{port}/health", timeout=1)[0] == 200, 30, "the server answers")
        load(port, 1.0, a.clients)  # warm-up
        before, started = cpu_ticks(server.pid), time.monotonic()
        sends = load(port, a.seconds, a.clients)
        after, took = cpu_ticks(server.pid), time.monotonic() - started
    finally:
        server.terminate()
        server.wait(30)
    hz = os.sysconf("SC_CLK_TCK")
    threads = {}
    for name, (user, system) in after.items():
        user0, system0 = before.get(name, (0, 0))
        if user - user0 or system - system0:
            threads[name] = {
                "user_us_per_send": round((user - user0) / hz * 1e6 / sends, 1),
                "system_us_per_send": round((system - system0) / hz * 1e6 / sends, 1)}
    total_s = sum(u + s for u, s in after.values()) - sum(u + s for u, s in before.values())
    print(json.dumps({"benchmark": "bench/single_sends.py", "clients": a.clients, "seconds": a.seconds,
                      "server": "installed: " + a.python if a.python else "source: " + a.root,
                      "sends": sends, "sends_per_s": round(sends / took, 1),
                      "server_cpu_us_per_send": round(total_s / hz * 1e6 / sends, 1), "threads": threads}, indent=1))


if __name__ == "__main__":
    main()
