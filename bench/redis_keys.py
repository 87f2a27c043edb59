"""Serial keys dispatched on the Redis backend (docs/redis.md, "Serial keys
on Redis"): --keys keys x --per-key messages, against the same number of
unkeyed messages, on two `hourglass serve --backend redis://...` nodes
sharing one fresh redis-server (free loopback port, no persistence).
Prints ONE JSON object.

    .venv/bin/python bench/redis_keys.py                  # 1,000 keys x 100 messages
    .venv/bin/python bench/redis_keys.py --keys 100 --per-key 20 --window-s 20
    .venv/bin/python bench/redis_keys.py --cluster-url 'redis://127.0.0.1:7000/0?cluster=1'

For each run ("unkeyed", then "keyed", each on a topic of its own): the
messages are sent in sendMsgBatch calls of 1,000 (message i of key i %
keys), their trigger times spread evenly over --window-s seconds starting
--lead-s after the first send; --consumers consumers (half on each node)
long-poll batches of up to 100 and ack each batch at once with one batch
ack. Per run: lateness (a message's pull answered minus its trigger time:
p50, p99, max, in ms), deliveries (every one is acked, so one a message),
and `held_twice`, the checker over the delivery history: per key, the
deliveries sorted by when their pull was answered, a delivery whose pull
was answered before the previous delivery's ack was sent (a key held by
two consumers at once; must be 0). `keyed_p99_over_unkeyed` is the ratio
of the two runs' p99 lateness (the target: within 2). Progress goes to
stderr.

With --cluster-url the nodes use that Redis (or Redis Cluster) instead of
a fresh redis-server; its topics are new ones each run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import aiohttp
import redis
from harness import Process, Server, free_port, percentile, unwind_on_signals, wait_until
from redis_bulk import call  # one API call, its answer's code checked

from broker.http.paths import PREFIX

BATCH = 1000


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def dispatch(bases: list[str], keyed: bool, args: argparse.Namespace) -> dict[str, Any]:
    topic = ("keyed-" if keyed else "unkeyed-") + uuid.uuid4().hex[:8]
    total = args.keys * args.per_key
    held: dict[str, list[tuple[float, float]]] = {}  # key -> (pull answered, ack sent), in ms since the epoch
    lateness: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        first_ms = int(time.time() * 1000) + int(args.lead_s * 1000)
        for start in range(0, total, BATCH):
            await call(session, bases[start // BATCH % len(bases)], "sendMsgBatch", topic=topic, msgs=[
                {"msgId": f"m{i:08d}", "msg": "x" * 40, "triggerTime": first_ms + int(i * args.window_s * 1000 / total),
                 **({"key": f"key-{i % args.keys:06d}"} if keyed else {})}
                for i in range(start, min(start + BATCH, total))])
        sent_ms = int(time.time() * 1000)
        if sent_ms > first_ms:
            log(f"  warning: the sends ended {sent_ms - first_ms} ms after the first trigger time (raise --lead-s)")
        log(f"  {topic}: {total} sent")

        async def consumer(base: str) -> None:
            while len(lateness) < total:
                answer = await call(session, base, "longPollingMsg", topic=topic, batch=100,
                                    longPollingTimeoutMillis=1000, ackTimeoutMillis=60_000)
                got = answer["delayMsgList"]
                if not got:
                    continue
                pulled_ms = time.time() * 1000
                lateness.extend(pulled_ms - m["triggerTime"] for m in got)
                acked_ms = time.time() * 1000
                for m in got:
                    held.setdefault(m["key"], []).append((pulled_ms, acked_ms))
                await call(session, base, "ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in got))

        consumers = [asyncio.create_task(consumer(bases[n % len(bases)])) for n in range(args.consumers)]
        await asyncio.wait_for(asyncio.gather(*consumers), args.lead_s + args.window_s + 600)
    held_twice = 0
    for key, spans in held.items():
        if key:
            spans.sort()
            held_twice += sum(1 for (_, sent), (pulled, _) in itertools.pairwise(spans) if pulled <= sent)
    lateness.sort()
    return {"messages": total, "deliveries": len(lateness), "held_twice": held_twice,
            "lateness_p50_ms": round(percentile(lateness, 0.5) or 0, 1),
            "lateness_p99_ms": round(percentile(lateness, 0.99) or 0, 1),
            "lateness_max_ms": round(lateness[-1], 1) if lateness else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--per-key", type=int, default=100)
    parser.add_argument("--window-s", type=float, default=60, help="the trigger times' spread")
    parser.add_argument("--lead-s", type=float, default=30, help="from the first send to the first trigger time")
    parser.add_argument("--consumers", type=int, default=16)
    parser.add_argument("--cluster-url", help="a Redis (Cluster) URL to use instead of a fresh redis-server")
    args = parser.parse_args()
    unwind_on_signals()
    work_dir = tempfile.mkdtemp(prefix="hourglass-redis-keys-")
    redis_server, nodes = None, []
    try:
        url = args.cluster_url
        if url is None:
            port = free_port()
            redis_server = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", work_dir], os.path.join(work_dir, "redis.log"))
            with redis.Redis(host="127.0.0.1", port=port) as client:
                wait_until(client.ping, 10, "redis-server", redis_server, every_s=0.02)
            url = f"redis://127.0.0.1:{port}/0"
        nodes = [Server.start(os.path.join(work_dir, f"node{i}"), "--backend", url,
                              log_path=os.path.join(work_dir, f"node{i}.log")) for i in range(2)]
        bases = [node.base + PREFIX for node in nodes]
        result: dict[str, Any] = {"keys": args.keys, "per_key": args.per_key, "window_s": args.window_s,
                                  "consumers": args.consumers, "redis": "cluster" if args.cluster_url else "standalone"}
        for name, keyed in (("unkeyed", False), ("keyed", True)):
            log(name)
            result[name] = asyncio.run(dispatch(bases, keyed, args))
        unkeyed_p99 = result["unkeyed"]["lateness_p99_ms"]
        result["keyed_p99_over_unkeyed"] = round(result["keyed"]["lateness_p99_ms"] / max(unkeyed_p99, 1), 2)
        print(json.dumps(result))
    finally:
        for node in nodes:
            node.stop()
        if redis_server is not None:
            redis_server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
