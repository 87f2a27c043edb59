"""The bulk calls (docs/api.md, "Bulk calls") over HTTP on this machine,
on the disk backend and on Redis: one topic of --messages waiting messages
over 24 h, keys of 100 messages each (--messages / 100 keys; disk only: the
Redis backend refuses keyed sends), 100 tags. Prints ONE JSON object.

    .venv/bin/python bench/bulk.py                          # 1,000,000 messages, both backends
    .venv/bin/python bench/bulk.py --messages 20000 --backends disk

Scenarios, in order, on a fresh node each backend (--fsync batch: every
answer is on disk):

  list_by_key_ms          listMsg key=K, first page (100)
  count_by_key_ms         listMsg key=K countOnly=true
  delete_by_key_ms        deleteMsgs key=K (100 messages), fsync included
  delete_by_tag_ms        deleteMsgs tag=T (--messages / 100 messages)
  reschedule_shift_s      rescheduleMsgs shiftMillis of 30 h of the messages
                          triggering in the first tenth of the 24 h
                          (--messages / 10), in calls of the default limit;
                          beside it send_during_reschedule_max_ms and _p99_ms,
                          the sendMsg calls made one a 10 ms meanwhile
  send_during_bulk_max_ms the slowest of the sendMsg calls made one a 10 ms
                          (or one after another when slower) while the
                          deleteMsgs all=true calls below run; beside it
                          send_during_bulk_p99_ms, their 99th percentile
                          (target: 50 ms on disk with 1,000,000 messages)
  delete_all_s            deleteMsgs all=true in calls of the default limit
                          until `more` is false; beside it the calls, the
                          RSS growth of the serving process over it
                          (delete_all_rss_growth_mb; on Redis also of
                          redis-server), what is left live (must be 0),
                          how many are DELETED (7), and how many a pull
                          then delivers (must be 0)

Key scenarios on Redis answer null. Each figure is one call's wall time
(the median of --repeat calls on distinct keys or tags where a call
changes state). Progress goes to stderr.
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
from collections.abc import Coroutine
from typing import Any

import aiohttp
from harness import Process, Server, free_port, memory_mb, unwind_on_signals, wait_until

from broker.http.paths import PREFIX

HOUR_MS = 3_600_000
TOPIC = "bulk"
TAGS = 100
PER_KEY = 100
BATCH = 1000


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Node:
    """One backend's serving process (and redis-server), and calls to it."""

    def __init__(self, backend: str, work_dir: str) -> None:
        self.backend = backend
        self.redis: Process | None = None
        flags = ["--fsync", "batch"]
        if backend == "redis":
            port = free_port()
            self.redis = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", work_dir], os.path.join(work_dir, "redis.log"))
            import redis
            client = redis.Redis(host="127.0.0.1", port=port)
            wait_until(client.ping, 10, "redis-server", self.redis, every_s=0.02)
            client.close()
            flags += ["--backend", f"redis://127.0.0.1:{port}/0"]
        self.server = Server.start(os.path.join(work_dir, "data"), *flags,
                                   log_path=os.path.join(work_dir, "serve.log"))
        self.base = self.server.base + PREFIX
        self.session: aiohttp.ClientSession | None = None

    def rss_mb(self, field: str = "rss_mb") -> float:
        """The serving process's (and redis-server's) RSS, or another field of harness.memory_mb."""
        total = memory_mb(self.server.proc.pid)[field]
        if self.redis is not None:
            total += memory_mb(self.redis.proc.pid)[field]
        return total

    async def call(self, method: str, name: str, **params: Any) -> dict[str, Any]:
        assert self.session is not None
        if name == "sendMsgBatch":
            request = self.session.post(self.base + name, json=params)
        elif method == "GET":
            request = self.session.get(self.base + name, params={k: str(v) for k, v in params.items()})
        else:
            request = self.session.post(self.base + name, data={k: str(v) for k, v in params.items()})
        async with request as response:
            answer: dict[str, Any] = await response.json(content_type=None)
        if answer.get("code") != 200:
            raise RuntimeError(f"{name}: {answer}")
        return answer

    async def timed(self, method: str, name: str, **params: Any) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        answer = await self.call(method, name, **params)
        return (time.perf_counter() - start) * 1000, answer

    def stop(self) -> None:
        self.server.stop()
        if self.redis is not None:
            self.redis.stop()


async def load(node: Node, messages: int, start_ms: int, keyed: bool) -> None:
    """`messages` waiting messages, their triggers spread evenly over 24 h from start_ms + 1 h."""
    step_ms = 24 * HOUR_MS / messages
    for first in range(0, messages, BATCH):
        msgs = []
        for i in range(first, min(first + BATCH, messages)):
            m: dict[str, Any] = {"msgId": f"m{i:08d}", "msg": "x" * 40, "tag": f"t{i % TAGS}",
                                 "triggerTime": start_ms + HOUR_MS + int(i * step_ms), "ttlMillis": 48 * HOUR_MS}
            if keyed:
                m["key"] = f"k{i // PER_KEY}"
            msgs.append(m)
        await node.call("POST", "sendMsgBatch", topic=TOPIC, msgs=msgs)
        if first % 100_000 == 0:
            log(f"  loaded {first + len(msgs)}")


async def sends_during(node: Node, work: Coroutine[Any, Any, None],
                       prefix: str) -> tuple[list[float], float, float]:
    """Run `work` while a sendMsg goes one a 10 ms (or one after another when
    slower): the sends' times (ms), and the peak RSS and peak anonymous RSS
    (the heap, without mapped file pages) in MB, sampled beside them."""
    task = asyncio.create_task(work)
    sends: list[float] = []
    peak, peak_anon = node.rss_mb(), node.rss_mb("rss_anon_mb")
    n = 0
    while not task.done():
        ms, _ = await node.timed("POST", "sendMsg", topic="other", msg="s", msgId=f"{prefix}{n}", delayMillis=HOUR_MS)
        sends.append(ms)
        n += 1
        peak, peak_anon = max(peak, node.rss_mb()), max(peak_anon, node.rss_mb("rss_anon_mb"))
        await asyncio.sleep(max(0.0, 0.01 - ms / 1000))  # one a 10 ms
    await task
    return sends, peak, peak_anon


async def scenarios(node: Node, messages: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keyed = node.backend == "disk"
    start_ms = int(time.time() * 1000)
    log(f"{node.backend}: loading {messages}")
    began = time.perf_counter()
    await load(node, messages, start_ms, keyed)
    out["load_s"] = round(time.perf_counter() - began, 1)
    keys = messages // PER_KEY

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    if keyed:
        out["list_by_key_ms"] = median([(await node.timed("GET", "listMsg", topic=TOPIC, key=f"k{(i * 7919) % keys}"))[0]
                                        for i in range(repeat)])
        out["count_by_key_ms"] = median([(await node.timed("GET", "listMsg", topic=TOPIC, countOnly="true",
                                                           key=f"k{(i * 7919) % keys}"))[0] for i in range(repeat)])
        times = []
        for i in range(repeat):
            ms, answer = await node.timed("POST", "deleteMsgs", topic=TOPIC, key=f"k{(i * 7919 + 1) % keys}")
            assert answer["deleted"] == PER_KEY, answer
            times.append(ms)
        out["delete_by_key_ms"] = median(times)
    else:
        out["list_by_key_ms"] = out["count_by_key_ms"] = out["delete_by_key_ms"] = None
    times = []
    for i in range(min(repeat, 3)):
        ms, answer = await node.timed("POST", "deleteMsgs", topic=TOPIC, tag=f"t{i}")
        times.append(ms)
    out["delete_by_tag_ms"] = median(times)
    out["delete_by_tag_count"] = answer["deleted"]

    lo, hi = start_ms + HOUR_MS, start_ms + HOUR_MS + int(2.4 * HOUR_MS)
    began, moved = time.perf_counter(), 0

    async def shift() -> None:
        nonlocal moved
        more = True
        while more:
            answer = await node.call("POST", "rescheduleMsgs", topic=TOPIC, triggerFrom=lo, triggerTo=hi,
                                     shiftMillis=HOUR_MS * 30)  # past the range: a later call finds only the rest
            moved += answer["rescheduled"]
            more = answer["more"]

    sends, _, _ = await sends_during(node, shift(), "r")
    out["reschedule_shift_s"] = round(time.perf_counter() - began, 3)
    out["reschedule_shift_count"] = moved
    out["send_during_reschedule_max_ms"] = round(max(sends), 2) if sends else None
    out["send_during_reschedule_p99_ms"] = round(sorted(sends)[int(len(sends) * 0.99)], 2) if sends else None

    rss_before, anon_before = node.rss_mb(), node.rss_mb("rss_anon_mb")
    calls = 0
    began = time.perf_counter()

    async def delete_all() -> None:
        nonlocal calls
        more = True
        while more:
            more = (await node.call("POST", "deleteMsgs", topic=TOPIC, all="true"))["more"]
            calls += 1

    sends, peak, peak_anon = await sends_during(node, delete_all(), "s")
    out["delete_all_s"] = round(time.perf_counter() - began, 3)
    out["delete_all_calls"] = calls
    out["delete_all_rss_growth_mb"] = round(peak - rss_before, 1)
    out["delete_all_rss_anon_growth_mb"] = round(peak_anon - anon_before, 1)
    out["send_during_bulk_max_ms"] = round(max(sends), 2) if sends else None
    out["send_during_bulk_p99_ms"] = round(sorted(sends)[int(len(sends) * 0.99)], 2) if sends else None
    out["send_during_bulk_count"] = len(sends)
    out["left_live"] = (await node.call("GET", "listMsg", topic=TOPIC, countOnly="true"))["count"]
    out["deleted_status_7"] = (await node.call("GET", "listMsg", topic=TOPIC, status="7", countOnly="true"))["count"]
    out["delivered_after"] = len((await node.call("POST", "pullMsg", topic=TOPIC, batch=1000))["delayMsgList"])
    return out


async def run_backend(backend: str, messages: int, repeat: int) -> dict[str, Any]:
    work_dir = tempfile.mkdtemp(prefix=f"hourglass-bulk-{backend}-")
    node = Node(backend, work_dir)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            node.session = session
            return await scenarios(node, messages, repeat)
    finally:
        node.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--backends", default="disk,redis")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.messages < 1000 or args.messages % 1000:
        parser.error("--messages must be a multiple of 1000")
    unwind_on_signals()
    result: dict[str, Any] = {"messages": args.messages, "keys": args.messages // PER_KEY, "tags": TAGS}
    for backend in args.backends.split(","):
        result[backend] = asyncio.run(run_backend(backend, args.messages, args.repeat))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
