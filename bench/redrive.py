"""A redriveMsgs job of many dead letters at a rate, on a real node: how
long it takes against the rate's ideal, the server's CPU a message, and
/health's answer time sampled meanwhile (docs/api.md, "Re-driving by
filter"). Prints ONE JSON object.

    .venv/bin/python bench/redrive.py                          # 1,000,000 at rate=10000: 100 s ideal
    .venv/bin/python bench/redrive.py --msgs 20000 --rate 10000
    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/redrive.py   # the installed (compiled) build

The dead letters are made the way users get them: sent with maxRetry=0,
pulled with a 1 ms ack timeout and never acked (status 6). Then one
redriveMsgs of the topic at --rate starts, getJob is asked every 0.2 s
until the job ends, and a thread asks /health every 10 ms meanwhile
(over a fresh connection each time, as a load balancer does).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request

from harness import Server, percentile, serve_version, tree_cpu_s, tree_memory_mb


def dead_letters(server: Server, topic: str, count: int) -> None:
    """`count` dead letters (status 6) in `topic`."""
    for first in range(0, count, 1000):
        msgs = [{"msgId": f"m{i}", "msg": "x", "maxRetry": 0} for i in range(first, min(count, first + 1000))]
        code, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert code == 200, body
    # Pulled until none is READY, rather than until `count` were answered: on
    # a node of shards a pull may take a message on another shard and give
    # it back (docs/api.md, "Shards"), and a 1 ms ack timeout can lapse first.
    while True:
        code, body = server.post("pullMsg", topic=topic, batch=1000, ackTimeoutMillis=1)
        assert code == 200 and isinstance(body, dict), body
        if body["delayMsgList"]:
            continue
        code, body = server.get("listMsg", topic=topic, status="6", countOnly="true")
        assert code == 200 and isinstance(body, dict), body
        if body["count"] >= count:
            return
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--msgs", type=int, default=1_000_000, help="dead letters re-driven")
    parser.add_argument("--rate", type=int, default=10_000, help="the job's rate (a second)")
    parser.add_argument("--shards", default="auto", help="the node's --shards")
    parser.add_argument("--health-every-s", type=float, default=0.01)
    args = parser.parse_args()
    topic = "dead"
    with tempfile.TemporaryDirectory(prefix="hourglass-redrive-") as work:
        server = Server.start(f"{work}/data", "--shards", args.shards, log_path=f"{work}/serve.log")
        try:
            made = time.perf_counter()
            dead_letters(server, topic, args.msgs)
            made_s = time.perf_counter() - made
            health_ms: list[float] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    began = time.perf_counter()
                    with urllib.request.urlopen(server.base + "/health", timeout=10) as answer:
                        answer.read()
                    health_ms.append((time.perf_counter() - began) * 1000)
                    stop.wait(args.health_every_s)

            pid = server.proc.pid
            cpu_before = tree_cpu_s(pid, set())
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            began = time.perf_counter()
            code, body = server.post("redriveMsgs", topic=topic, rate=args.rate)
            assert code == 200 and isinstance(body, dict), body
            job_id = body["jobId"]
            while True:
                code, body = server.get("getJob", jobId=job_id)
                assert code == 200 and isinstance(body, dict), body
                job = body["job"]
                if job["state"] != "running":
                    break
                time.sleep(0.2)
            took_s = time.perf_counter() - began
            cpu_s = tree_cpu_s(pid, set()) - cpu_before
            stop.set()
            sampler.join()
            rss_mb = tree_memory_mb(pid)["rss_mb"]
        finally:
            server.stop()
    health_ms.sort()
    ideal_s = args.msgs / args.rate if args.rate else None
    print(json.dumps({
        "msgs": args.msgs, "rate": args.rate, "shards": args.shards, "build": serve_version(),
        "made_dead_s": round(made_s, 1), "state": job["state"], "redriven": job["redriven"],
        "matched": job["matched"], "took_s": round(took_s, 2), "ideal_s": ideal_s,
        "took_over_ideal": round(took_s / ideal_s, 3) if ideal_s else None,
        "server_cpu_s": round(cpu_s, 2), "server_cpu_us_per_msg": round(cpu_s * 1e6 / max(1, job["redriven"]), 1),
        "server_rss_mb": rss_mb, "health_samples": len(health_ms),
        "health_ms_p50": round(percentile(health_ms, 0.5) or 0, 1),
        "health_ms_p99": round(percentile(health_ms, 0.99) or 0, 1),
        "health_ms_max": round(health_ms[-1], 1) if health_ms else None,
    }, indent=2))


if __name__ == "__main__":
    main()
