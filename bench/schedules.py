"""Recurring schedules under load: N schedules firing every minute (cron
`* * * * *`, all at the same instant; with --spread `S * * * * *`, schedule
i at second S = i % 60, so that as many fall due each second), misfire=once,
taken by long-polling consumers that ack each pulled batch in one ackMsg,
for M minutes. Prints ONE JSON object.

    .venv/bin/python bench/schedules.py                              # 100,000 schedules, 10 minutes, one node
    .venv/bin/python bench/schedules.py --mode kill9                 # the node SIGKILLed and restarted every minute
    .venv/bin/python bench/schedules.py --mode cluster --kills 5     # a 3-node cluster, 5 leader SIGKILLs
    .venv/bin/python bench/schedules.py --spread                     # the same spread over each minute
    .venv/bin/python bench/schedules.py --schedules 200 --minutes 2  # a short correctness run

What it reports:

  put_s, puts_per_s      the schedules put through the Python client,
                         --concurrency at a time (puts waiting on the node
                         share one write and one send: broker.schedules.keeper)
  expected_runs          nominal minutes from each schedule's first run to
                         the last minute that ended --settle-s before the end
  delivered_runs, lost   distinct runs consumed, and those expected but never
  early                  runs consumed before their nominal time or triggerTime
  made_twice             runs whose message was made more than once (more
                         than one produceTime seen for one msgId)
  redelivered            deliveries beyond the first of a run (at least once)
  lateness_ms            consumer receive - nominal time: p50, p99, max
  fire_lateness_ms       consumer receive - the run's triggerTime (nominal +
                         its jitter, --jitter-ms): p50, p99, max
  rss_mb_max             the node's (the leader's) largest VmRSS sampled
  server_cpu_us_per_run  the node's CPU (from /proc) over the M minutes, a run
                         due in them
  by_minute              each minute (by nominal time; negative while the
                         puts went on): runs, lateness p99 and max, the node's
                         CPU share of one core, its largest RSS, RssAnon and
                         RssFile
  kills                  SIGKILLs made (kill9: of the node; cluster: of the leader)

Only run it on a quiet machine: it takes the machine for --minutes. The
node runs this tree's broker, pure Python, or the build installed for
HOURGLASS_SERVE_PYTHON (bench/harness.py); `build` says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from typing import Any

import aiohttp
from harness import Server, cpu_s, memory_mb, percentile, serve_version

from broker.client import DelayQueueClient, DelayQueueError

TOPICS = 8  # schedules spread over this many topics, one consumer task or more each
MINUTE_MS = 60_000


class Tally:
    """What the consumers saw, by msgId."""

    def __init__(self) -> None:
        self.first_seen_ms: dict[str, int] = {}
        self.fire_lateness_ms: list[int] = []  # receive - triggerTime (nominal + jitter), a run's first delivery
        self.produced: dict[str, set[int]] = {}
        self.deliveries = 0
        self.early = 0

    def seen(self, msg_id: str, scheduled_ms: int, trigger_ms: int, produce_ms: int, now_ms: int) -> None:
        self.deliveries += 1
        self.produced.setdefault(msg_id, set()).add(produce_ms)
        if msg_id not in self.first_seen_ms:
            self.first_seen_ms[msg_id] = now_ms
            self.fire_lateness_ms.append(now_ms - trigger_ms)
            if now_ms < trigger_ms or now_ms < scheduled_ms:
                self.early += 1


def cron_of(i: int, spread: bool) -> str:
    """Schedule i's cron: every minute at second 0 (all at the same
    instant), or with --spread at second i % 60 (1/60th of them each second)."""
    return f"{i % 60} * * * * *" if spread else "* * * * *"


async def put_all(urls: list[str], count: int, concurrency: int, spread: bool,
                  jitter_ms: int) -> tuple[float, dict[str, int]]:
    """Put `count` schedules; their first nominal times by scheduleId."""
    firsts: dict[str, int] = {}
    queue = iter(range(count))
    started = time.monotonic()

    async def worker(client: DelayQueueClient) -> None:
        for i in queue:
            sid = f"s{i:07d}"
            for _ in range(50):
                try:
                    schedule = await client.put_schedule(f"sched{i % TOPICS}", sid, "run", cron=cron_of(i, spread),
                                                         jitter_ms=jitter_ms or None, misfire="once",
                                                         ttl_ms=3_600_000)
                    break
                except (TimeoutError, DelayQueueError, OSError, aiohttp.ClientError):
                    await asyncio.sleep(0.5)  # a put is not repeated by the client after an unclear failure
            else:
                raise RuntimeError(f"putSchedule {sid} kept failing")
            firsts[sid] = schedule["nextFireTimes"][0]

    async with DelayQueueClient(urls, timeout_s=30, retries=20) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return time.monotonic() - started, firsts


async def consume(urls: list[str], tally: Tally, stop: asyncio.Event, per_topic: int) -> None:
    async def loop(client: DelayQueueClient, topic: str) -> None:
        while not stop.is_set():
            try:
                batch = await client.long_poll(topic, timeout_ms=1000, batch=500)
            except (TimeoutError, DelayQueueError, OSError, aiohttp.ClientError):  # a node killed: again
                await asyncio.sleep(0.2)
                continue
            now_ms = int(time.time() * 1000)
            for m in batch:
                tally.seen(m.msg_id, m.scheduled_time or 0, m.trigger_time, m.produce_time, now_ms)
            if batch:
                with contextlib.suppress(DelayQueueError, OSError, TimeoutError, aiohttp.ClientError):
                    await client.ack_many(topic, [m.msg_id for m in batch])

    async with DelayQueueClient(urls, timeout_s=10, retries=20) as client:
        await asyncio.gather(*(loop(client, f"sched{t}") for t in range(TOPICS) for _ in range(per_topic)))


class Sampler(threading.Thread):
    """The node's RSS and CPU, each second: the largest RSS, and the CPU
    seconds it used (a restarted or new leader's counted from its first
    sample on), with when."""

    def __init__(self, pid_of: Any) -> None:
        super().__init__(daemon=True)
        self.pid_of = pid_of
        self.max_mb = 0.0
        self.cpu_s = 0.0
        # (time.time(), cpu_s so far, RSS MB, RssAnon MB: the heap, RssFile MB: mapped file pages resident)
        self.samples: list[tuple[float, float, float, float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        last_pid, last_cpu = None, 0.0
        while not self.done.wait(1.0):
            with contextlib.suppress(Exception):
                pid = self.pid_of()
                memory = memory_mb(pid)
                rss = memory["rss_mb"]
                self.max_mb = max(self.max_mb, rss)
                cpu = cpu_s(pid)
                if pid == last_pid:
                    self.cpu_s += cpu - last_cpu
                last_pid, last_cpu = pid, cpu
                self.samples.append((time.time(), self.cpu_s, rss, memory.get("rss_anon_mb", 0.0),
                                     memory.get("rss_file_mb", 0.0)))

    def cpu_between(self, start_s: float, end_s: float) -> float:
        inside = [s[1] for s in self.samples if start_s <= s[0] <= end_s]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def largest_between(self, start_s: float, end_s: float, field: int) -> float | None:
        """The largest of a sample's memory field (2 RSS, 3 RssAnon, 4 RssFile) in the span."""
        return max((s[field] for s in self.samples if start_s <= s[0] <= end_s), default=None)


def by_minute(started_ms: int, first: int, minutes: int, lateness_of: dict[int, list[int]],
              sampler: Sampler) -> list[dict]:
    """Each minute from `first` (negative: while the puts went on) to the
    run's last: its runs' lateness p99 and max (by nominal time), the
    node's CPU share of one core and its largest RSS (and of it, the largest
    RssAnon, the heap, and RssFile, mapped file pages resident)."""
    out = []
    for k in range(min(first, 0), minutes):
        late = sorted(lateness_of.get(k, []))
        start_s = (started_ms + k * MINUTE_MS) / 1000
        out.append({"minute": k, "runs": len(late), "p99_ms": percentile(late, 0.99) if late else None,
                    "max_ms": late[-1] if late else None,
                    "cpu_share": round(sampler.cpu_between(start_s, start_s + 60) / 60, 3),
                    "rss_mb_max": sampler.largest_between(start_s, start_s + 60, 2),
                    "rss_anon_mb_max": sampler.largest_between(start_s, start_s + 60, 3),
                    "rss_file_mb_max": sampler.largest_between(start_s, start_s + 60, 4)})
    return out


def serve_flags(schedules: int) -> list[str]:
    return ["--max-schedules", str(schedules + 100), "--max-schedule-bytes", str(max(64 << 20, schedules * 1024))]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="hourglass-schedules-")
    kills = 0
    if args.mode == "cluster":
        from cluster import Cluster
        cluster = Cluster.start(os.path.join(root, "cluster"), *serve_flags(args.schedules))
        leader = cluster.wait_leader()
        cluster.wait_known(leader)
        urls = cluster.urls
        state = {"leader": leader}
        sampler = Sampler(lambda: cluster.nodes[state["leader"]].proc.pid)
    else:
        server = Server.start(os.path.join(root, "data"), *serve_flags(args.schedules),
                              log_path=os.path.join(root, "serve.log"))
        urls = [server.base]
        current = {"server": server}
        sampler = Sampler(lambda: current["server"].proc.pid)
    sampler.start()
    tally = Tally()
    stop = asyncio.Event()
    try:
        consumers = asyncio.create_task(consume(urls, tally, stop, args.consumers))  # runs fire while puts go on
        put_s, firsts = await put_all(urls, args.schedules, args.concurrency, args.spread, args.jitter_ms)
        started_ms = int(time.time() * 1000)
        end_ms = started_ms + args.minutes * MINUTE_MS
        gap_s = args.minutes * 60 / (args.kills + 1) if args.mode == "cluster" else 60.0
        next_kill = time.monotonic() + gap_s
        while int(time.time() * 1000) < end_ms:
            await asyncio.sleep(0.5)
            if args.mode == "single" or time.monotonic() < next_kill:
                continue
            if args.mode == "kill9":
                port = int(current["server"].base.rsplit(":", 1)[1])
                current["server"].kill()
                current["server"] = await asyncio.to_thread(
                    Server.start, os.path.join(root, "data"), *serve_flags(args.schedules),
                    log_path=os.path.join(root, "serve.log"), port=port, wait_s=300)
                kills += 1
            elif kills < args.kills:
                old = state["leader"]
                health = cluster.health(old) or {}
                cluster.kill(old)
                kills += 1
                new = await asyncio.to_thread(cluster.wait_leader, old, int(health.get("term", 0)), 120)
                await asyncio.to_thread(cluster.restart, old)
                await asyncio.to_thread(cluster.wait_known, new, 120)
                state["leader"] = new
            next_kill = time.monotonic() + gap_s
        await asyncio.sleep(args.settle_s)  # the last runs consumed
        stop.set()
        await asyncio.wait_for(consumers, 30)
    finally:
        sampler.done.set()
        if args.mode == "cluster":
            cluster.stop()
        else:
            current["server"].stop()
    last_nominal = end_ms - MINUTE_MS  # a run due later has had less than a minute and --settle-s
    expected = {f"{sid}@{t}" for sid, first in firsts.items() for t in range(first, last_nominal + 1, MINUTE_MS)}
    delivered = set(tally.first_seen_ms)
    lateness_of: dict[int, list[int]] = {}  # by minute of the run (negative: while the puts went on)
    for m in delivered:
        nominal = int(m.rsplit("@", 1)[1])
        lateness_of.setdefault((nominal - started_ms) // MINUTE_MS, []).append(tally.first_seen_ms[m] - nominal)
    lateness = sorted(late for lates in lateness_of.values() for late in lates)
    fire = sorted(tally.fire_lateness_ms)
    fire_lateness = {"p50": percentile(fire, 0.5), "p99": percentile(fire, 0.99), "max": fire[-1] if fire else None}
    run_cpu_s = sampler.cpu_between(started_ms / 1000, end_ms / 1000)
    runs_in_run = sum(len(v) for k, v in lateness_of.items() if 0 <= k < args.minutes)
    return {"mode": args.mode, "build": serve_version(), "spread": args.spread,
            "schedules": args.schedules, "minutes": args.minutes, "concurrency": args.concurrency,
            "put_s": round(put_s, 2), "puts_per_s": round(args.schedules / put_s, 1) if put_s else None,
            "expected_runs": len(expected), "delivered_runs": len(delivered & expected),
            "lost": len(expected - delivered), "early": tally.early,
            "made_twice": sum(1 for produced in tally.produced.values() if len(produced) > 1),
            "redelivered": tally.deliveries - len(delivered),
            "lateness_ms": {"p50": percentile(lateness, 0.5), "p99": percentile(lateness, 0.99),
                            "max": lateness[-1] if lateness else None},
            "jitter_ms": args.jitter_ms, "fire_lateness_ms": fire_lateness,
            "rss_mb_max": sampler.max_mb, "kills": kills,
            "server_cpu_us_per_run": round(run_cpu_s / runs_in_run * 1e6, 1) if runs_in_run else None,
            "by_minute": by_minute(started_ms, min(lateness_of, default=0), args.minutes, lateness_of, sampler)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("single", "kill9", "cluster"), default="single")
    p.add_argument("--schedules", type=int, default=100_000)
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--jitter-ms", type=int, default=0,
                   help="each schedule's jitterMillis: its runs fire at nominal + [0, this) ms (docs/api.md)")
    p.add_argument("--spread", action="store_true",
                   help="each schedule at second i %% 60 of every minute (cron with seconds), not all at second 0")
    p.add_argument("--kills", type=int, default=5, help="cluster: leader SIGKILLs, spread over the run")
    p.add_argument("--concurrency", type=int, default=64, help="puts in flight")
    p.add_argument("--consumers", type=int, default=2, help="long-polling loops a topic")
    p.add_argument("--settle-s", type=float, default=20.0, help="consuming after the last minute")
    return p.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
