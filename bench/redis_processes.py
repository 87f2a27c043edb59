"""Batched sends into one Redis (`appendfsync always`) through one or more
Redis-backed `hourglass serve` processes: what more processes in front of
the same Redis give on this machine (issue "Every core of every node",
item 2: `--backend redis:// --shards N`). Prints one JSON object of
every run on stdout (and each run on stderr as it ends).

    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/redis_processes.py   # 1 then 2 processes, 200,000 each
    .venv/bin/python bench/redis_processes.py --processes 1,2,1,2 --msgs 100000

Each run starts its own redis-server (AOF, `appendfsync always`, loopback,
a free port, a temporary directory) and N nodes (`--shards 1`, free ports),
then 4 producer processes send `--msgs` in all with sendMsgBatch, 100
messages a call (100 bytes each, due in an hour), producer i to node
i mod N; every answer must be 200. The figures: messages a second, and the
CPU a message of the nodes (all N summed) and of redis-server, from /proc.
The nodes are the build bench/harness.py's `serve_command` runs
(HOURGLASS_SERVE_PYTHON's install, else this tree); everything started
is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time

import redis
from harness import HOST, Process, Server, cpu_s, free_port, unwind_on_signals, wait_until

BATCH = 100
PRODUCERS = 4


def plain_signals() -> None:
    """A producer ends by the pool's SIGTERM as a process does (not by the
    benchmark's `unwind_on_signals`, which it inherits)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def produce(args: tuple[int, int]) -> int:
    """`n` messages to the node on `port`, BATCH a sendMsgBatch, on one keep-alive connection."""
    port, n = args
    c = http.client.HTTPConnection(HOST, port, timeout=30)
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


def run(redis_server: str, processes: int, msgs: int) -> dict[str, object]:
    work = tempfile.mkdtemp(prefix="hg-redis-procs-")
    redis_port = free_port()
    store = Process([redis_server, "--bind", HOST, "--port", str(redis_port), "--dir", work, "--appendonly", "yes",
                     "--appendfsync", "always", "--save", ""], os.path.join(work, "redis.log"))
    nodes: list[Server] = []
    try:
        wait_until(redis.Redis(host=HOST, port=redis_port).ping, 10, "redis-server", store, every_s=0.02)
        for i in range(processes):
            nodes.append(Server.start(os.path.join(work, f"node{i}"), "--shards", "1",
                                      "--backend", f"redis://{HOST}:{redis_port}/0",
                                      log_path=os.path.join(work, f"node{i}.log")))
        ports = [int(node.base.rsplit(":", 1)[1]) for node in nodes]
        before = sum(cpu_s(node.process.pid) for node in nodes), cpu_s(store.pid)
        t0 = time.perf_counter()
        share = msgs // PRODUCERS // BATCH * BATCH
        with multiprocessing.Pool(PRODUCERS, initializer=plain_signals) as pool:
            sent = sum(pool.map(produce, [(ports[i % processes], share) for i in range(PRODUCERS)]))
        took = time.perf_counter() - t0
        nodes_cpu = sum(cpu_s(node.process.pid) for node in nodes) - before[0]
        redis_cpu = cpu_s(store.pid) - before[1]
        return {"processes": processes, "msgs": sent, "msgs_per_s": round(sent / took, 1),
                "nodes_cpu_us_per_msg": round(nodes_cpu / sent * 1e6, 1),
                "redis_cpu_us_per_msg": round(redis_cpu / sent * 1e6, 1)}
    finally:
        for node in nodes:
            node.stop()
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", default="1,2", help="comma list of process counts, a run each (default 1,2)")
    p.add_argument("--msgs", type=int, default=200_000, help="messages a run (default 200,000)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    a = p.parse_args()
    unwind_on_signals()
    runs = []
    for n in (int(x) for x in a.processes.split(",")):
        result = run(a.redis_server, n, a.msgs)
        print(json.dumps(result), file=sys.stderr)
        runs.append(result)
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
