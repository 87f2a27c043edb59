"""One busy serial key (docs/api.md, "Tags and serial keys"; the key index,
storage/key_index.py): --messages sends in sendMsgBatch calls of 1,000,
first with no key on one fresh node, then all under ONE key on another,
the same triggers (spread over 24 h from an hour ahead), while a prober
asks /health every 20 ms. Then, on the keyed node: listMsg by that key
(first page of 100), its count, and deleteMsgs by that key of the first
100,000, each with /health probed beside it. Last, on a third fresh node,
the burst: --burst-batches (100) sendMsgBatch calls of 1,000 under ONE
key, due now (no delay: all in one part of the key index), back to back
from one client while /health is asked every 5 ms on a second connection,
during the sends and for a second after; right after the last batch,
listMsg limit=1 by the key, --repeat times in a row. Prints ONE JSON object.

    .venv/bin/python bench/hot_key.py                       # 1,000,000 messages, then the burst
    .venv/bin/python bench/hot_key.py --messages 200000
    .venv/bin/python bench/hot_key.py --burst-only          # the burst alone

Each node runs with --fsync batch (every answer on disk). Rates are sends
answered per second of wall time; cpu_us_per_msg is the serving process's
own CPU (utime + stime, /proc) over the load divided by the messages.
health_max_ms is the slowest /health answer over the phase. The burst's
figures: health_during_max_ms / _p99_ms over the sends,
health_after_max_ms / _p99_ms over the second after the last answer
(the listMsg calls' time included), list_limit1_first_ms (the call right
after the last batch), list_limit1_max_ms / _p99_ms over the --repeat
calls.
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
from typing import Any

import aiohttp
from harness import Server, cpu_s, memory_mb, percentile, unwind_on_signals

from broker.http.paths import PREFIX

HOUR_MS = 3_600_000
TOPIC = "hot"
KEY = "account-42"
BATCH = 1000


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Prober:
    """/health asked every `every_s` on its own connection; the slowest answer."""

    def __init__(self, base: str, every_s: float = 0.02) -> None:
        self.base, self.every_s = base, every_s
        self.times_ms: list[float] = []
        self.sent_at: list[float] = []  # perf_counter() when each was asked
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                start = time.perf_counter()
                async with session.get(self.base + "/health") as response:
                    await response.read()
                self.times_ms.append((time.perf_counter() - start) * 1000)
                self.sent_at.append(start)
                await asyncio.sleep(self.every_s)

    def __enter__(self) -> Prober:
        self.times_ms = []
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def summary(self, since: float | None = None, until: float | None = None, prefix: str = "health") -> dict[str, Any]:
        """max and p99 of the answers to probes asked in [since, until) (perf_counter; None: unbounded)."""
        ordered = sorted(t for t, at in zip(self.times_ms, self.sent_at, strict=True)
                         if (since is None or at >= since) and (until is None or at < until))
        return {f"{prefix}_max_ms": round(ordered[-1], 1) if ordered else None,
                f"{prefix}_p99_ms": round(percentile(ordered, 0.99) or 0.0, 1) if ordered else None,
                f"{prefix}_probes": len(ordered)}


async def call(session: aiohttp.ClientSession, base: str, name: str, method: str = "POST",
               **params: Any) -> dict[str, Any]:
    if name == "sendMsgBatch":
        request = session.post(base + PREFIX + name, json=params)
    elif method == "GET":
        request = session.get(base + PREFIX + name, params={k: str(v) for k, v in params.items()})
    else:
        request = session.post(base + PREFIX + name, data={k: str(v) for k, v in params.items()})
    async with request as response:
        answer: dict[str, Any] = await response.json(content_type=None)
    if answer.get("code") != 200:
        raise RuntimeError(f"{name}: {str(answer)[:300]}")
    return answer


async def load(server: Server, messages: int, start_ms: int, keyed: bool) -> dict[str, Any]:
    step_ms = 24 * HOUR_MS / messages
    pid = server.proc.pid
    cpu0, wall0 = cpu_s(pid), time.perf_counter()
    batch_ms: list[float] = []
    async with aiohttp.ClientSession() as session:
        with Prober(server.base) as prober:
            for first in range(0, messages, BATCH):
                msgs = []
                for i in range(first, min(first + BATCH, messages)):
                    m: dict[str, Any] = {"msgId": f"m{i:08d}", "msg": "x" * 40,
                                         "triggerTime": start_ms + HOUR_MS + int(i * step_ms),
                                         "ttlMillis": 48 * HOUR_MS}
                    if keyed:
                        m["key"] = KEY
                    msgs.append(m)
                t = time.perf_counter()
                await call(session, server.base, "sendMsgBatch", topic=TOPIC, msgs=msgs)
                batch_ms.append((time.perf_counter() - t) * 1000)
                if first % 100_000 == 0:
                    log(f"  {'keyed' if keyed else 'plain'}: {first + len(msgs)} sent")
    wall, cpu = time.perf_counter() - wall0, cpu_s(pid) - cpu0
    tenth = max(1, len(batch_ms) // 10)
    return {"msgs_per_s": round(messages / wall), "cpu_us_per_msg": round(cpu / messages * 1e6, 1),
            "batch_ms_first_tenth_median": round(statistics.median(batch_ms[:tenth]), 1),
            "batch_ms_last_tenth_median": round(statistics.median(batch_ms[-tenth:]), 1),
            "batch_ms_max": round(max(batch_ms), 1), **prober.summary()}


async def by_key(server: Server, messages: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        base = server.base
        times = []
        with Prober(base) as prober:
            for _ in range(repeat):
                t = time.perf_counter()
                answer = await call(session, base, "listMsg", "GET", topic=TOPIC, key=KEY, limit=100)
                times.append((time.perf_counter() - t) * 1000)
                assert len(answer["delayMsgList"]) == 100, answer.keys()
            t = time.perf_counter()
            answer = await call(session, base, "listMsg", "GET", topic=TOPIC, key=KEY, limit=100,
                                cursor=answer["cursor"])
            out["list_second_page_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["list_first_page_ms_median"] = round(statistics.median(times), 1)
        out["list_first_page_ms_max"] = round(max(times), 1)
        out["list_health"] = prober.summary()
        with Prober(base) as prober:
            t = time.perf_counter()
            answer = await call(session, base, "listMsg", "GET", topic=TOPIC, key=KEY, countOnly="true")
            out["count_ms"] = round((time.perf_counter() - t) * 1000, 1)
            out["count"] = answer["count"]
        out["count_health"] = prober.summary()
        with Prober(base) as prober:
            t = time.perf_counter()
            answer = await call(session, base, "deleteMsgs", topic=TOPIC, key=KEY, limit=min(100_000, messages))
            out["delete_first_100k_ms"] = round((time.perf_counter() - t) * 1000, 1)
            out["deleted"], out["more"] = answer["deleted"], answer["more"]
        out["delete_health"] = prober.summary()
    return out


async def burst(server: Server, batches: int, repeat: int) -> dict[str, Any]:
    """`batches` sendMsgBatch calls of BATCH under one key, due now, back to
    back; /health probed every 5 ms during and for a second after; listMsg
    limit=1 by the key `repeat` times right after the last batch."""
    out: dict[str, Any] = {"batches": batches, "messages": batches * BATCH}
    async with aiohttp.ClientSession() as session:
        with Prober(server.base, every_s=0.005) as prober:
            await asyncio.sleep(0.1)  # the prober's connection open
            began = time.perf_counter()
            for b in range(batches):
                msgs = [{"msgId": f"b{i:08d}", "msg": "x" * 40, "key": KEY, "ttlMillis": 48 * HOUR_MS}
                        for i in range(b * BATCH, (b + 1) * BATCH)]
                await call(session, server.base, "sendMsgBatch", topic=TOPIC, msgs=msgs)
            sent = time.perf_counter()
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                answer = await call(session, server.base, "listMsg", "GET", topic=TOPIC, key=KEY, limit=1)
                times.append((time.perf_counter() - t) * 1000)
                assert len(answer["delayMsgList"]) == 1, answer.keys()
            await asyncio.sleep(max(0.0, sent + 1.0 - time.perf_counter()))
            out["send_s"] = round(sent - began, 2)
            out.update(prober.summary(began, sent, "health_during"))
            out.update(prober.summary(sent, None, "health_after"))
    ordered = sorted(times)
    out["list_limit1_first_ms"] = round(times[0], 1)
    out["list_limit1_max_ms"] = round(ordered[-1], 1)
    out["list_limit1_p99_ms"] = round(percentile(ordered, 0.99) or 0.0, 1)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="hot-key-")
    out: dict[str, Any] = {"messages": args.messages, "batch": BATCH}
    start_ms = int(time.time() * 1000)
    try:
        if not args.burst_only:
            await loads(work, out, args, start_ms)
        server = Server.start(os.path.join(work, "burst"), "--fsync", "batch",
                              log_path=os.path.join(work, "burst.log"))
        try:
            log(f"burst: {args.burst_batches} batches of {BATCH} under one key")
            out["burst"] = await burst(server, args.burst_batches, args.repeat)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


async def loads(work: str, out: dict[str, Any], args: argparse.Namespace, start_ms: int) -> None:
    """The plain and the keyed load of --messages, and the calls by key."""
    for keyed in (False, True):
        name = "keyed" if keyed else "plain"
        server = Server.start(os.path.join(work, name), "--fsync", "batch",
                              log_path=os.path.join(work, f"{name}.log"))
        try:
            log(f"{name}: loading {args.messages}")
            out[name] = await load(server, args.messages, start_ms, keyed)
            out[name]["rss_mb"] = memory_mb(server.proc.pid)["rss_mb"]
            if keyed:
                out["by_key"] = await by_key(server, args.messages, args.repeat)
        finally:
            server.stop()
    out["keyed_over_plain_rate"] = round(out["keyed"]["msgs_per_s"] / out["plain"]["msgs_per_s"], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="listMsg first pages timed (each phase)")
    parser.add_argument("--burst-batches", type=int, default=100, help="batches of 1,000 of the burst")
    parser.add_argument("--burst-only", action="store_true", help="the burst alone (no --messages loads)")
    args = parser.parse_args()
    unwind_on_signals()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
