"""A standing backlog on one node: waiting, then the same number ready with
no consumer. RSS, disk bytes per message, and the restart after SIGKILL.

    .venv/bin/python bench/backlog.py --msgs 10000000        # the README's "flat RAM" claim at 10 M
    .venv/bin/python bench/backlog.py --msgs 100000 --states ready
    .venv/bin/python bench/backlog.py --msgs 300000 --states ready --serve-flags="--shards auto"   # the default node
    .venv/bin/python bench/backlog.py --msgs 20000 --states held --serve-flags="--max-inflight 20000"
    .venv/bin/python bench/backlog.py --msgs 10000000 --keys 1000000 --states waiting   # keyed (the key index)

For each state, a fresh `hourglass serve --fsync batch` on a fresh data
directory is sent --msgs messages by sendMsgBatch (--batch each,
--producers at once, --payload-bytes each):
  waiting   trigger times uniform over 1 h .. --days days ahead
  ready     due at once (delayMillis 0), and nobody pulls: all of them
            stay ready; RAM holds only the ready window (docs/api.md)
  held      due at once, then pulled (batches of 1,000, an ack timeout of
            1 h) and not acked: all of them in flight, which RAM holds
            (raise --max-inflight with --serve-flags past 10,000)
with --keys K, message i has the serial key "k<i % K>" (the key index,
storage/key_index.py, holds them on disk), and a listMsg by one key is
timed after the restart (`list_by_key_ms`);
then, after --settle-s: the node's memory, summed over its processes (a
node of shards: the supervisor and each shard; bench/harness.py
tree_memory_mb), idle before the sends and with the backlog,
bytes on disk per message, a SIGKILL, and a start on the same directory:
  restart_health_s       seconds from the spawn until /health answers
  restart_pull_s         ... until the first pullMsg (batch 1, of the topic) answers code 200
  counts_whole_at_pull   getTopicInfo, asked right after that pull, counts every message
                         (waiting + ready + consuming: a ready backlog's pull took one)
  restart_s              restart_pull_s when the counts were whole then (the restart figure)
  topic_info_answered_s  ... until that getTopicInfo answered (its delay buckets read the
                         files that straddle a bucket edge)
and the memory then.
One JSON object on stdout; every process stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import aiohttp
from harness import Server, disk_bytes, tree_memory_mb, unwind_on_signals

from broker.http.paths import PREFIX

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


async def fill(base: str, topic: str, args: argparse.Namespace, state: str) -> float:
    """Send args.msgs messages; messages a second."""
    body = "x" * args.payload_bytes
    rng = random.Random(1)
    next_index = 0
    started = time.monotonic()

    def batch() -> list[dict[str, Any]] | None:
        nonlocal next_index
        if next_index >= args.msgs:
            return None
        count = min(args.batch, args.msgs - next_index)
        now = int(time.time() * 1000)
        msgs = [{"msgId": f"m{next_index + i}", "msg": body,
                 **({"delayMillis": 0} if state in ("ready", "held")
                    else {"triggerTime": now + rng.randint(HOUR_MS, args.days * DAY_MS)}),
                 **({"key": f"k{(next_index + i) % args.keys}"} if args.keys else {})}
                for i in range(count)]
        next_index += count
        if next_index % (args.batch * 1000) == 0:
            log(f"{topic}: {next_index:,} sent ({next_index / (time.monotonic() - started):,.0f}/s)")
        return msgs

    async def producer(session: aiohttp.ClientSession) -> None:
        while (msgs := batch()) is not None:
            for _ in range(20):
                async with session.post(base + PREFIX + "sendMsgBatch", json={"topic": topic, "msgs": msgs}) as r:
                    answer = await r.json(content_type=None)
                    if r.status == 200 and answer.get("code") == 200:
                        break
                    await asyncio.sleep(0.5)  # 429/503: a limit; the same batch again (same ids)
            else:
                raise RuntimeError(f"sendMsgBatch kept failing: {r.status} {answer}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(producer(session) for _ in range(args.producers)))
    sent: int = args.msgs
    return sent / (time.monotonic() - started)


async def hold(base: str, topic: str, msgs: int) -> int:
    """Pull the topic's messages, an ack timeout of 1 h, until `msgs` are
    in flight or a pull finds none; how many were taken."""
    taken = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while taken < msgs:
            form = {"topic": topic, "batch": str(min(1000, msgs - taken)), "ackTimeoutMillis": str(HOUR_MS)}
            async with session.post(base + PREFIX + "pullMsg", data=form) as r:
                got = (await r.json(content_type=None)).get("delayMsgList") or []
            if not got:
                break
            taken += len(got)
    return taken


QUEUE_OF = {"waiting": "waitingQueueSize", "ready": "readyQueueSize", "held": "ackQueueSize"}


def counted(server: Server, topic: str, state: str) -> int | None:
    status, answer = server.get("getTopicInfo", topic=topic)
    if status != 200 or not isinstance(answer, dict):
        return None
    count: int = answer["data"][QUEUE_OF[state]]
    return count


def stored(server: Server, topic: str) -> int | None:
    """Every message of the topic the node counts: waiting, ready and consuming."""
    status, answer = server.get("getTopicInfo", topic=topic)
    if status != 200 or not isinstance(answer, dict):
        return None
    data = answer["data"]
    total: int = data["waitingQueueSize"] + data["readyQueueSize"] + data["ackQueueSize"]
    return total


def first_pull(server: Server, topic: str, spawned: float, timeout_s: float) -> float | None:
    """Seconds from `spawned` to the first pullMsg (batch 1) answered code 200."""
    while time.monotonic() - spawned < timeout_s:
        status, answer = server.post("pullMsg", topic=topic, batch=1, ackTimeoutMillis=600_000)
        if status == 200 and isinstance(answer, dict) and answer.get("code") == 200:
            return time.monotonic() - spawned
        time.sleep(0.005)
    return None


def measure(state: str, args: argparse.Namespace, root: str) -> dict[str, Any]:
    data = f"{root}/{state}"
    topic = f"backlog-{state}"
    server = Server.start(data, "--fsync", "batch", *args.serve_flags, log_path=f"{root}/{state}.log")
    try:
        time.sleep(args.settle_s)
        idle = tree_memory_mb(server.proc.pid)
        log(f"{state}: idle {idle}; sending {args.msgs:,}")
        rate = asyncio.run(fill(server.base, topic, args, state))
        if state == "held":
            time.sleep(1)  # (due at once: READY within the wheel's tick)
            log(f"held: {asyncio.run(hold(server.base, topic, args.msgs)):,} pulled")
        time.sleep(args.settle_s)
        result: dict[str, Any] = {"msgs": args.msgs, "send_msgs_per_s": round(rate), "counted": counted(server, topic, state),
                                  "memory_idle": idle, "memory": tree_memory_mb(server.proc.pid),
                                  "disk_bytes_per_msg": round(disk_bytes(data) / args.msgs, 1)}
        log(f"{state}: {result}; SIGKILL and restart")
        server.kill()
        spawned = time.monotonic()
        server = Server.start(data, "--fsync", "batch", *args.serve_flags, log_path=f"{root}/{state}.log",
                              wait_s=args.restart_timeout_s)
        health_s = time.monotonic() - spawned
        pull_s = first_pull(server, topic, spawned, args.restart_timeout_s)
        whole_at_pull = stored(server, topic) == args.msgs  # asked right after that pull's answer
        counts_s = time.monotonic() - spawned
        result.update({"restart_health_s": round(health_s, 3),
                       "restart_pull_s": None if pull_s is None else round(pull_s, 3),
                       "counts_whole_at_pull": whole_at_pull,
                       "restart_s": round(pull_s, 3) if pull_s is not None and whole_at_pull else None,
                       "topic_info_answered_s": round(counts_s, 3),
                       "memory_after_restart": tree_memory_mb(server.proc.pid)})
        if args.keys:
            started = time.perf_counter()
            status, answer = server.get("listMsg", topic=topic, key="k7")
            took_ms = (time.perf_counter() - started) * 1000
            found = len(answer["delayMsgList"]) if status == 200 and isinstance(answer, dict) else None
            result.update({"keys": args.keys, "list_by_key_ms": round(took_ms, 2), "list_by_key_found": found,
                           "memory_after_list": tree_memory_mb(server.proc.pid)})
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--msgs", type=int, default=1_000_000, help="messages in each backlog (default 1,000,000)")
    p.add_argument("--states", default="waiting,ready", help="comma list: waiting, ready, held (default waiting,ready)")
    p.add_argument("--days", type=int, default=30, help="waiting: trigger times up to this many days ahead (30)")
    p.add_argument("--batch", type=int, default=1000, help="messages a sendMsgBatch (1000)")
    p.add_argument("--producers", type=int, default=4, help="concurrent senders (4)")
    p.add_argument("--payload-bytes", type=int, default=100, help="each message's body (100)")
    p.add_argument("--keys", type=int, default=0, help="spread the messages over this many serial keys (0: none)")
    p.add_argument("--settle-s", type=float, default=5.0, help="pause before measuring (5)")
    p.add_argument("--serve-flags", default="", help="more flags for hourglass serve, one string: "
                   "\"--shards auto\" (the default node; bench/harness.py starts one shard unless asked)")
    p.add_argument("--restart-timeout-s", type=float, default=600.0, help="bound on the restart (600)")
    args = p.parse_args(argv)
    args.serve_flags = args.serve_flags.split()
    unwind_on_signals()
    root = tempfile.mkdtemp(prefix="hourglass-backlog-")
    out: dict[str, Any] = {"parameters": vars(args)}
    try:
        for state in args.states.split(","):
            out[state] = measure(state.strip(), args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0 if all(out[s.strip()]["restart_s"] is not None for s in args.states.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
