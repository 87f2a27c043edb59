"""Failover drills and replicated ingest on a real 3-node cluster.

    .venv/bin/python bench/failover.py                     # one drill of each kind, then ingest
    .venv/bin/python bench/failover.py --repeat 5 --only drills   # sigkill, sigstop, sigterm; five times
    .venv/bin/python bench/failover.py --repeat 20 --drills sigkill
    .venv/bin/python bench/failover.py --only ingest --acks leader

Starts `hourglass serve --node-id nX --cluster ...` three times on free
loopback ports (bench/cluster.py), fresh data directories under a temp dir,
and stops every process by PID at the end.

Drills (bench/cluster.py `drill`): a producer sends --rate messages/s for
--run-s seconds through the Python client given all three addresses,
each due --delay-ms after sending; two consumers long-poll and ack. At
--fault-at-s the leader gets the fault:
  sigkill  kill -9, then restarted (it rejoins as a follower)
  sigstop  frozen for --freeze-s, then resumed (it must stand down)
  sigterm  a graceful handover, then restarted
--repeat N runs the --drills sequence N times in its order (each drill
after the others, on the same cluster: a SIGTERM meets a node that was
killed or frozen before and came back).
Each drill prints one JSON object: failover_s (fault -> a node of a
higher term reports it leads, i.e. its wheel runs), exit_s (sigterm: the
SIGTERM -> the old leader's process exited), lost (answered 200, never
delivered), duplicates and their cause, lateness of messages due in
[fault - 1 s, fault + 3 s], due_near_fault (due within 100 ms of the
fault: the duplicate budget), double_dispatch_terms (terms two nodes led,
from every node's leadership.log), rejoined (all log ends equal after).

Ingest: --ingest-msgs messages by sendMsgBatch (--batch-size each,
--producers concurrent), posted to the leader, every answer a 200 after
a quorum has the batch on disk (--acks quorum) -> ingest_batch_msgs_per_s,
and each node's CPU time per message (node_cpu_us_per_msg).

A summary line (JSON) ends the output, for each fault: failover_s
max/median and every drill's, exit_s max (sigterm), lost, duplicates,
released_twice (a delivery with retry 0 beyond the first) and
redelivered_after_ack (both never right) totals; and the ingest rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import aiohttp
from cluster import Cluster, drill
from harness import cpu_s


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def ingest(url: str, total: int, batch_size: int, producers: int) -> dict:
    topic = f"ingest-{int(time.time())}"
    bodies = []
    for start in range(0, total, batch_size):
        msgs = [{"msgId": f"{topic}-{i}", "msg": "x" * 100, "delayMillis": 60_000 + (i * 7919) % 86_400_000}
                for i in range(start, min(total, start + batch_size))]
        bodies.append((json.dumps({"topic": topic, "msgs": msgs}).encode(), len(msgs)))
    queue = list(reversed(bodies))
    errors = []

    async def producer():
        async with aiohttp.ClientSession() as session:
            while queue:
                body, _ = queue.pop()
                async with session.post(url + "/camellia/delayQueue/sendMsgBatch", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    if r.status != 200:
                        errors.append((r.status, (await r.text())[:200]))

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - started
    return {"ingest_msgs": total, "ingest_s": round(elapsed, 3),
            "ingest_batch_msgs_per_s": round(total / elapsed), "ingest_errors": errors[:5]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drills", default="sigkill,sigstop,sigterm", help="comma-separated faults (default all three)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the --drills sequence this many times, in its order (default 1)")
    p.add_argument("--rate", type=int, default=100, help="messages sent per second in a drill (default 100)")
    p.add_argument("--run-s", type=float, default=5.0, help="seconds of sending per drill (default 5)")
    p.add_argument("--fault-at-s", type=float, default=2.0, help="fault this long into the drill (default 2)")
    p.add_argument("--freeze-s", type=float, default=5.0, help="sigstop: frozen this long (default 5)")
    p.add_argument("--delay-ms", default="300,2500", help="send delay range, min,max ms (default 300,2500)")
    p.add_argument("--ingest-msgs", type=int, default=200_000, help="messages for the ingest run (default 200,000)")
    p.add_argument("--batch-size", type=int, default=500, help="messages per sendMsgBatch (default 500)")
    p.add_argument("--producers", type=int, default=4, help="concurrent ingest producers (default 4)")
    p.add_argument("--acks", default="quorum", help="quorum (default) or leader")
    p.add_argument("--only", default=None, help="drills | ingest")
    p.add_argument("--keep", action="store_true", help="keep the data directories and logs")
    args = p.parse_args(argv)
    delay = tuple(int(x) for x in args.delay_ms.split(","))
    root = tempfile.mkdtemp(prefix="hourglass-failover-")
    log(f"work dir {root}")
    results, summary = [], {"acks": args.acks}
    cluster = Cluster.start(os.path.join(root, "cluster"), "--acks", args.acks)
    try:
        if args.only in (None, "drills"):
            for i in range(args.repeat):
                for fault in args.drills.split(","):
                    log(f"drill {fault} {i + 1}/{args.repeat}")
                    result = drill(cluster, fault, rate=args.rate, run_s=args.run_s, fault_at_s=args.fault_at_s,
                                   delay_ms=delay, freeze_s=args.freeze_s)
                    print(json.dumps(result), flush=True)
                    results.append(result)
        if args.only in (None, "ingest"):
            leader = cluster.wait_leader()
            log(f"ingest: {args.ingest_msgs} messages to leader {leader}")
            before = {n: cpu_s(cluster.nodes[n].proc.pid) for n in cluster.nodes}
            figures = asyncio.run(ingest(cluster.url(leader), args.ingest_msgs, args.batch_size, args.producers))
            time.sleep(1.0)  # followers finish applying
            figures["node_cpu_us_per_msg"] = {
                ("leader " if n == leader else "follower ") + n:
                    round((cpu_s(cluster.nodes[n].proc.pid) - before[n]) * 1e6 / args.ingest_msgs, 1)
                for n in cluster.nodes}
            print(json.dumps({"scenario": "ingest", "acks": args.acks, **figures}), flush=True)
            summary.update(figures)
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    for fault in {r["fault"] for r in results}:
        runs = [r for r in results if r["fault"] == fault]
        times = [r["failover_s"] for r in runs]
        exits = [r["exit_s"] for r in runs if r["exit_s"] is not None]
        summary[fault] = {"drills": len(runs), "failover_s_max": max(times),
                          "failover_s_median": round(statistics.median(times), 3), "failover_s": times,
                          **({"exit_s_max": max(exits)} if exits else {}),
                          "lost": sum(r["lost"] for r in runs), "duplicates": sum(r["duplicates"] for r in runs),
                          "released_twice": sum(r["duplicate_causes"]["released twice (retry=0)"] for r in runs),
                          "redelivered_after_ack": sum(r["duplicate_causes"]["redelivered after its ack"]
                                                       for r in runs),
                          "due_near_fault": sum(r["due_near_fault"] for r in runs),
                          "double_dispatch_terms": sum(len(r["double_dispatch_terms"]) for r in runs),
                          "all_rejoined": all(r["rejoined"] for r in runs)}
    print(json.dumps({"summary": summary}), flush=True)
    # (after a SIGKILL a release no quorum took is released again: docs/cluster.md, "What a failure costs")
    bad = any(r["lost"] or r["double_dispatch_terms"]
              or (r["fault"] != "sigkill" and r["duplicate_causes"]["released twice (retry=0)"])
              for r in results) or summary.get("ingest_errors")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
