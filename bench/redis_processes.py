"""Batched sends into one Redis (`appendfsync always`) through one or more
Redis-backed `hourglass serve` processes: what more processes in front of
the same Redis give on this machine (issue "Every core of every node",
item 2: `--backend redis:// --shards N`). Prints one JSON object a run.

    .venv/bin/python bench/redis_processes.py                       # 1 then 2 processes, 200,000 messages each
    .venv/bin/python bench/redis_processes.py --processes 1,2,1,2 --msgs 100000

Each run starts its own redis-server (AOF, `appendfsync always`, loopback,
a free port, a temporary directory) and N nodes (`--shards 1`, free ports),
then 4 producer processes send `--msgs` in all with sendMsgBatch, 100
messages a call (100 bytes each, due in an hour), producer i to node
i mod N; every answer must be 200. The figures: messages a second, and the
CPU a message of the nodes (all N summed) and of redis-server, from /proc.
Everything started is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BATCH = 100
PRODUCERS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(port: int, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the node on port {port} did not answer /health within {timeout_s} s")


def produce(args: tuple[int, int]) -> int:
    port, n = args
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"topic": "t", "msgs": [{"msg": "x" * 100, "delayMillis": 3_600_000}] * BATCH})
    sent = 0
    while sent < n:
        c.request("POST", "/camellia/delayQueue/sendMsgBatch", body, {"Content-Type": "application/json"})
        answer = c.getresponse()
        text = answer.read()
        if answer.status != 200:
            raise SystemExit(f"sendMsgBatch answered {answer.status}: {text[:200]!r}")
        sent += BATCH
    return sent


def run(hourglass: str, redis_server: str, processes: int, msgs: int) -> dict[str, object]:
    work = tempfile.mkdtemp(prefix="hg-redis-procs-")
    started: list[subprocess.Popen[bytes]] = []
    try:
        redis_port = free_port()
        redis = subprocess.Popen([redis_server, "--bind", "127.0.0.1", "--port", str(redis_port), "--dir", work,
                                  "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                                 stdout=subprocess.DEVNULL)
        started.append(redis)
        ports = [free_port() for _ in range(processes)]
        for i, port in enumerate(ports):
            with open(os.path.join(work, f"node{i}.log"), "wb") as log:
                started.append(subprocess.Popen(
                    [hourglass, "serve", "--host", "127.0.0.1", "--port", str(port), "--shards", "1",
                     "--data-dir", os.path.join(work, f"node{i}"), "--backend", f"redis://127.0.0.1:{redis_port}/0"],
                    stdout=subprocess.DEVNULL, stderr=log))
        for port in ports:
            wait_healthy(port)
        nodes = [p.pid for p in started[1:]]
        before = [cpu_s(pid) for pid in nodes], cpu_s(redis.pid)
        t0 = time.perf_counter()
        share = msgs // PRODUCERS // BATCH * BATCH
        with multiprocessing.Pool(PRODUCERS) as pool:
            sent = sum(pool.map(produce, [(ports[i % processes], share) for i in range(PRODUCERS)]))
        took = time.perf_counter() - t0
        node_cpu = sum(cpu_s(pid) for pid in nodes) - sum(before[0])
        redis_cpu = cpu_s(redis.pid) - before[1]
        return {"processes": processes, "msgs": sent, "msgs_per_s": round(sent / took, 1),
                "nodes_cpu_us_per_msg": round(node_cpu / sent * 1e6, 1),
                "redis_cpu_us_per_msg": round(redis_cpu / sent * 1e6, 1)}
    finally:
        for p in reversed(started):
            p.terminate()
        for p in started:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", default="1,2", help="comma list of process counts, a run each (default 1,2)")
    p.add_argument("--msgs", type=int, default=200_000, help="messages a run (default 200,000)")
    p.add_argument("--hourglass", default=os.path.join(os.path.dirname(sys.executable), "hourglass"),
                   help="the hourglass command (default: beside this Python)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    a = p.parse_args()
    runs = []
    for n in (int(x) for x in a.processes.split(",")):
        result = run(a.hourglass, a.redis_server, n, a.msgs)
        print(json.dumps(result), file=sys.stderr)
        runs.append(result)
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
