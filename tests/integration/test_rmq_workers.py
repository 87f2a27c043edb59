"""RMQ's per-key serial consumption (seed 002) with RmqWorker leases on a
real redis-server: three worker processes share a topic's 8 slots; one is
killed with SIGKILL while it consumes. Its slots move to the others within
the lease time, every message is consumed, and no key is ever consumed by
two workers at once (the killed worker's last delivery counts as running
until the kill; its message is delivered again only after that)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time

import pytest

redis = pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from harness import child_env  # noqa: E402
from serving import ROOT  # noqa: E402

pytestmark = pytest.mark.slow

LEASE_MS = 1500
WORK_MS = 400  # longer than the gap between two sends of a key: without the slot rule they would overlap
KEYS = 24
PER_KEY = 6


def test_a_killed_workers_slots_move_and_no_key_is_consumed_twice_at_once(redis_url):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.flushdb()
    child = os.path.join(ROOT, "tests", "integration", "rmq_worker_child.py")
    env = child_env()
    workers = {w: subprocess.Popen([sys.executable, child, redis_url, "serial", w, str(LEASE_MS), str(WORK_MS)],
                                   env=env) for w in ("w1", "w2", "w3")}
    try:
        deadline = time.monotonic() + 20
        while r.llen("ready") < 3:
            assert time.monotonic() < deadline and all(p.poll() is None for p in workers.values())
            time.sleep(0.05)
        time.sleep(LEASE_MS / 1000)  # heartbeats balance the slots: 3, 3, 2
        import asyncio

        from broker.redis.rmq import Kind, RmqConfig, RmqTopic  # sends from this process

        async def send(round_: int) -> int:
            """One message per key, due now; how many were stored (a send
            whose key is still pending merges into it, as RMQ's)."""
            topic = await RmqTopic.connect(redis_url, "serial", Kind.FIXED_TIME,
                                           RmqConfig(slots=8, ack_timeout_ms=1500, sweep_ms=200))
            async with topic:
                now = int(time.time() * 1000)
                sent = [await topic.send_fixed_time(f"body {k} {round_}", now, key=f"k{k}") for k in range(KEYS)]
            return sum(not s.merged for s in sent)
        stored = 0
        for round_ in range(PER_KEY // 2):  # rounds while keys are being consumed: new messages of busy keys
            stored += asyncio.run(send(round_))
            time.sleep(0.3)
        owned_before = {w: r.get(f"owned:{w}") for w in workers}
        victim = next(w for w in ("w1", "w2", "w3") if owned_before[w])
        victim_slots = {int(s) for s in owned_before[victim].split(",")}
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait()
        killed_ms = int(time.time() * 1000)
        for round_ in range(PER_KEY // 2, PER_KEY):
            stored += asyncio.run(send(round_))
            time.sleep(0.3)
        # its slots move to the living within the lease time (plus a heartbeat)
        deadline = time.monotonic() + (2 * LEASE_MS) / 1000 + 2
        while True:
            owners = {int(s) for w in workers if w != victim
                      for s in (r.get(f"owned:{w}") or "").split(",") if s}
            if victim_slots <= owners:
                break
            assert time.monotonic() < deadline, f"slots {victim_slots - owners} not taken over"
            time.sleep(0.05)
        # everything is consumed: nothing left in any slot's store or prepare
        deadline = time.monotonic() + 30
        while any(r.zcard(f"hg:rmq:{{serial:{slot}}}:{part}") for slot in range(8) for part in ("store", "prepare")):
            assert time.monotonic() < deadline, "not every message was consumed"
            time.sleep(0.1)
    finally:
        for p in workers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    runs: dict[str, list[tuple[int, int, str]]] = {}
    open_runs: dict[tuple[str, str], int] = {}
    for entry in r.lrange("log", 0, -1):
        kind, key, worker, ms = entry.split("|")
        if kind == "start":
            assert (key, worker) not in open_runs, f"key {key} consumed twice at once by {worker}"
            open_runs[(key, worker)] = int(ms)
        else:
            runs.setdefault(key, []).append((open_runs.pop((key, worker)), int(ms), worker))
    for (key, worker), start in open_runs.items():  # only the killed worker's, cut by the kill
        assert worker == victim, (key, worker)
        runs.setdefault(key, []).append((start, killed_ms, worker))
    for key, spans in runs.items():
        spans.sort()
        for (s1, e1, w1), (s2, e2, w2) in itertools.pairwise(spans):
            assert s2 >= e1, f"key {key} consumed by {w1} [{s1}, {e1}] and {w2} [{s2}, {e2}] at once"
    # each stored message was consumed (the killed one twice), but for one the
    # killed delivery's retry may have merged into (RMQ: a newer pending one of its key)
    assert sum(len(s) for s in runs.values()) >= stored > KEYS * 2


def test_slots_are_shared_out_as_workers_join_and_leave(redis_url):
    import asyncio

    from broker.redis.rmq import Kind, RmqConfig, RmqTopic

    async def scenario() -> list[tuple[int, ...]]:
        topic = await RmqTopic.connect(redis_url, "shares", Kind.PRIORITY, RmqConfig(slots=8))
        async with topic:
            a, b, c = (topic.worker(w, lease_ms=600) for w in ("a", "b", "c"))
            await a.heartbeat()
            seen = [(len(a.owned),)]
            await b.heartbeat()  # b finds every slot taken: a gives up its extra ones at its next beat
            await a.heartbeat()
            await b.heartbeat()
            seen.append((len(a.owned), len(b.owned)))
            await c.heartbeat()
            for w in (a, b, c, a, b, c):
                await w.heartbeat()
            seen.append(tuple(sorted((len(a.owned), len(b.owned), len(c.owned)))))
            assert not (a.owned & b.owned or a.owned & c.owned or b.owned & c.owned)
            await c.close()  # leaves: the others take its slots
            for w in (a, b, a, b):
                await w.heartbeat()
            seen.append((len(a.owned), len(b.owned)))
            await a.close()
            await b.close()
            return seen

    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    assert asyncio.run(scenario()) == [(8,), (4, 4), (2, 3, 3), (4, 4)]
