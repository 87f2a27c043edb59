"""Fault drills: real nodes, a mixed workload, a seeded nemesis, and a
checker of the whole history (docs/drills.md).

    .venv/bin/python bench/drills.py --seed 7                       # a 3-node cluster, a short drill
    .venv/bin/python bench/drills.py --standalone --kills 10
    .venv/bin/python bench/drills.py --recheck history.json      # the checker over a --history file
    .venv/bin/python bench/drills.py --kills 100 --pauses 10 --partitions 5 --full-disks 1 \\
        --rate 500 --budget-s 1800 --seed 1                          # the long run (docs/drills.md)

It starts the nodes (bench/drill_nodes.py: a standalone node, or three
with a cluster secret whose peer traffic runs through the drill's proxies,
bench/drill_proxies.py), drives the workload, injects the faults one
after another at random (seeded) while the workload runs, then stops the
faults, lets every message due come in, and checks the history
(bench/drill_history.py). It prints one JSON object and exits 1 when a
count that must be zero is not (lost, early, after_ack, after_delete,
key_violations, answer_mismatch, double-leader terms) or the nodes did not converge.

The workload (`Workload`): producers at --rate operations a second in
all, a mix of sends (due now, in seconds, or in minutes up to
--max-delay-s; some with a serial key, a tag or a priority), batch sends
of 10, deletes and reschedules of messages sent earlier; consumers
long-poll two topics (one keyed) and ack each message, or in batches, or
nack some. Every call is recorded with its start and end (the history).

The nemesis (`Nemesis`), each fault in turn after a random pause:
  kill        kill -9 of a random node (the leader included), restarted
              after a random 0-2 s on the same data directory
  pause       SIGSTOP of the leader past the election timeout, then SIGCONT:
              it must not answer or dispatch anything as leader again
              (the checker's rules, and no term led by two nodes)
  partition   every link of the leader or a follower black-holed, dropped
              or slowed through the proxies, then healed
  full_disk   the node on a small tmpfs (root only) filled to the last byte,
              then freed (and restarted if it left)
  slow_disk   every fsync and fdatasync of the leader or a follower (the
              node, standalone) delayed 50-800 ms for 3-6 s
              (bench/drill_slow_disk.py), then not
For each: `failover_s` (a fault that hit the leader: until a node of a
higher term leads) and `recover_s` (from the heal until every node names
one leader and holds the log the leader had at the heal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from drill_history import Delivery, Fault, History, Op, Sent, check, count_lost
from drill_nodes import Nodes
from drill_proxies import Mode
from harness import percentile, unwind_on_signals

from broker.client import DelayMsg, DelayQueueClient, NewMsg

PLAIN, KEYED = "drill-plain", "drill-keyed"
# The keyed topic's serial keys: enough that one message at a time per key
# keeps up with the producers' keyed sends on a loaded cluster (with 16, a
# backlog of ten thousand grew over a 30-minute run and outlasted the drain).
KEYS = tuple(f"k{i}" for i in range(256))
TAGS = ("red", "green", "blue")
ACK_TIMEOUT_MS = 5_000
BATCH = 10


def now_ms() -> int:
    return int(time.time() * 1000)


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


@dataclass
class Settings:
    cluster: bool = True
    seed: int = 1
    rate: int = 200  # producer operations a second, in all
    consumers: int = 6
    max_delay_s: float = 20.0  # the longest delay a send asks for
    kills: int = 3
    pauses: int = 1
    partitions: int = 2
    full_disks: int = 0
    slow_disks: int = 0
    gap_s: tuple[float, float] = (1.0, 3.0)  # pause between faults
    pause_s: tuple[float, float] = (1.5, 3.0)  # SIGSTOP held (past the 1 s election timeout)
    partition_s: tuple[float, float] = (2.0, 4.0)
    full_disk_s: float = 3.0
    slow_disk_s: tuple[float, float] = (3.0, 6.0)
    slow_disk_ms: tuple[int, int] = (50, 800)  # the delay of each fsync while the disk is slow
    small_disk_mb: int = 256
    budget_s: float = 170.0  # the faults stop by then (the drain and checks come on top)
    settle_s: float = 30.0  # bound on the final convergence
    drain_max_s: float = 600.0  # bound on the drain after the faults, however the consumers progress
    root: str | None = None
    keep: bool = False
    history_path: str | None = None  # --history: the whole history as JSON, for a closer look


@dataclass
class FaultRecord:
    fault: Fault
    failover_s: float | None = None
    recover_s: float | None = None
    note: str = ""


@dataclass
class Workload:
    """Producers and consumers on the nodes, recording `history`."""

    nodes: Nodes
    settings: Settings
    rng: random.Random
    history: History = field(default_factory=History)
    operations: Counter[str] = field(default_factory=Counter)
    recent: dict[str, list[str]] = field(default_factory=lambda: {PLAIN: [], KEYED: []})
    producing: bool = True
    consuming: bool = True
    _count: int = 0

    def client(self, i: int) -> DelayQueueClient:
        urls = self.nodes.urls
        return DelayQueueClient(urls[i % len(urls):] + urls[:i % len(urls)], timeout_s=3.0, retries=20,
                                max_backoff_s=0.5)

    async def produce(self) -> None:
        clients = [self.client(i) for i in range(4)]
        in_flight: set[asyncio.Task[None]] = set()
        cap = asyncio.Semaphore(400)
        try:
            started = time.monotonic()
            n = 0
            while self.producing:
                n += 1
                await asyncio.sleep(max(0.0, started + n / self.settings.rate - time.monotonic()))
                await cap.acquire()
                task = asyncio.create_task(self._one(clients[n % len(clients)]))
                task.add_done_callback(lambda _: cap.release())
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.wait(in_flight)
        finally:
            for c in clients:
                await c.close()

    async def _one(self, client: DelayQueueClient) -> None:
        roll = self.rng.random()
        if roll < 0.10:
            await self._send_batch(client)
        elif roll < 0.15 and self.recent[PLAIN]:
            await self._delete(client)
        elif roll < 0.20 and self.recent[PLAIN]:
            await self._reschedule(client)
        else:
            await self._send(client)

    def _new(self, topic: str) -> NewMsg:
        self._count += 1
        msg_id = f"m{self._count}"
        roll = self.rng.random()
        if roll < 0.2:
            delay_ms = 0
        elif roll < 0.7:
            delay_ms = self.rng.randint(1, 3000)
        elif roll < 0.95:
            delay_ms = self.rng.randint(3000, max(3001, int(self.settings.max_delay_s * 1000) // 3))
        else:
            delay_ms = self.rng.randint(3000, max(3001, int(self.settings.max_delay_s * 1000)))
        key = self.rng.choice(KEYS) if topic == KEYED else None
        tag = self.rng.choice(TAGS) if self.rng.random() < 0.3 else None
        priority = self.rng.randint(0, 9) if self.rng.random() < 0.3 else None
        return NewMsg("x" * self.rng.randint(8, 200), msg_id, delay_ms, priority=priority, tag=tag, key=key)

    def _sent(self, topic: str, m: DelayMsg, key: str | None, end: int) -> None:
        self.history.sent.append(Sent(topic, m.msg_id, m.trigger_time, m.expire_time, m.max_retry, key, end))
        recent = self.recent[topic]
        recent.append(m.msg_id)
        if len(recent) > 2000:
            del recent[:1000]

    async def _send(self, client: DelayQueueClient) -> None:
        topic = KEYED if self.rng.random() < 0.3 else PLAIN
        new = self._new(topic)
        self.operations["send"] += 1
        self.history.send_attempts += 1
        with contextlib.suppress(Exception):
            m = await client.send(topic, new.msg, msg_id=new.msg_id, delay_ms=new.delay_ms, priority=new.priority,
                                  tag=new.tag, key=new.key)
            self._sent(topic, m, new.key, now_ms())

    async def _send_batch(self, client: DelayQueueClient) -> None:
        topic = KEYED if self.rng.random() < 0.3 else PLAIN
        news = [self._new(topic) for _ in range(BATCH)]
        self.operations["send_batch"] += 1
        self.history.send_attempts += len(news)
        with contextlib.suppress(Exception):
            answered = await client.send_batch(topic, news)
            end = now_ms()
            for new, m in zip(news, answered):
                self._sent(topic, m, new.key, end)

    async def _delete(self, client: DelayQueueClient) -> None:
        msg_id = self.rng.choice(self.recent[PLAIN])
        self.operations["delete"] += 1
        start = now_ms()
        ok, applied = False, False
        with contextlib.suppress(Exception):
            applied = await client.delete(PLAIN, msg_id)
            ok = True
        self.history.ops.append(Op("delete", PLAIN, msg_id, start, now_ms(), ok, applied))

    async def _reschedule(self, client: DelayQueueClient) -> None:
        msg_id = self.rng.choice(self.recent[PLAIN])
        self.operations["reschedule"] += 1
        start = now_ms()
        asked = start + self.rng.randint(0, 5000)
        ok, applied, trigger = False, False, asked
        try:
            m = await client.reschedule(PLAIN, msg_id, asked)
            ok, applied = True, m is not None
            trigger = m.trigger_time if m is not None else asked
        except Exception:
            # 404 or 409 too: it may answer a retry whose first attempt moved
            # the message (then consumed, or acked), so the outcome is unknown
            pass
        self.history.ops.append(Op("reschedule", PLAIN, msg_id, start, now_ms(), ok, applied, trigger))

    async def consume(self, i: int) -> None:
        """Consumer `i`: long polls the plain topic (even i) or the keyed
        one (odd i); acks each message (i % 4 < 2), or a poll's messages in
        one batch ack; nacks one in twenty."""
        client = self.client(i + 1)
        topic = KEYED if i % 2 else PLAIN
        per_message = i % 4 < 2
        try:
            while self.consuming:
                start = now_ms()
                self.operations["poll"] += 1
                try:
                    msgs = await client.long_poll(topic, timeout_ms=1000, batch=32, ack_timeout_ms=ACK_TIMEOUT_MS)
                except Exception:
                    await asyncio.sleep(0.1)
                    continue
                end = now_ms()
                for m in msgs:
                    self.history.deliveries.append(Delivery(topic, m.msg_id, start, end, m.retry, m.trigger_time,
                                                            m.key or None, ACK_TIMEOUT_MS, m.produce_time,
                                                            m.scheduled_time))
                nacks = [m for m in msgs if self.rng.random() < 0.05]
                acks = [m for m in msgs if m not in nacks]
                await asyncio.gather(*(self._settle(client, "nack", topic, [m.msg_id]) for m in nacks))
                if per_message:
                    await asyncio.gather(*(self._settle(client, "ack", topic, [m.msg_id]) for m in acks))
                elif acks:
                    await self._settle(client, "ack", topic, [m.msg_id for m in acks])
        finally:
            await client.close()

    async def _settle(self, client: DelayQueueClient, kind: str, topic: str, ids: list[str]) -> None:
        self.operations[kind if len(ids) == 1 else "ack_batch"] += 1
        start = now_ms()
        ok = False
        statuses: dict[str, int | None] = {}
        try:
            if kind == "nack":
                await client.nack(topic, ids[0])
            elif len(ids) == 1:
                await client.ack(topic, ids[0])
            else:
                statuses = await client.ack_many(topic, ids)
            ok = True
        except Exception:
            pass
        end = now_ms()
        for msg_id in ids:
            applied = ok and (not statuses or statuses.get(msg_id) == 4)
            self.history.ops.append(Op(kind, topic, msg_id, start, end, ok, applied))


class Nemesis:
    """Injects the faults of `settings`, in a seeded random order, one at a
    time; records each in the history and in `records`."""

    def __init__(self, nodes: Nodes, settings: Settings, rng: random.Random, history: History) -> None:
        self.nodes, self.settings, self.rng, self.history = nodes, settings, rng, history
        self.records: list[FaultRecord] = []
        self.skipped: dict[str, str] = {}
        self.exited: dict[str, int] = {}  # node -> times it exited by itself between faults

    def plan(self) -> list[str]:
        s = self.settings
        kinds = ["kill"] * s.kills + ["pause"] * s.pauses + ["partition"] * s.partitions
        if not self.nodes.cluster:
            if s.pauses or s.partitions:
                self.skipped["pause/partition"] = "a standalone node has no leader to pause or peers to cut"
            kinds = ["kill"] * s.kills
        if s.full_disks:
            if self.nodes.small_disk is None:
                self.skipped["full_disk"] = self.nodes.disk_note or "no node on a small disk"
            else:
                kinds += ["full_disk"] * s.full_disks
        kinds += ["slow_disk"] * s.slow_disks
        self.rng.shuffle(kinds)
        return kinds

    async def run(self, deadline: float) -> None:
        for kind in self.plan():
            if time.monotonic() > deadline:
                self.skipped[f"{kind} (and later)"] = "out of --budget-s"
                break
            await asyncio.sleep(self.rng.uniform(*self.settings.gap_s))
            await asyncio.to_thread(self._settled, 60)
            record = await asyncio.to_thread(getattr(self, f"_{kind}"))
            self.records.append(record)
            self.history.faults.append(record.fault)
            log(f"{kind} {record.fault.node}{' (leader)' if record.fault.was_leader else ''}: failover "
                f"{record.failover_s} s, recovered {record.recover_s} s {record.note}")

    # -- each fault (run in a thread: they wait on the nodes) ----------------------------

    def _settled(self, wait_s: float) -> None:
        """Until one leader leads the rest; a node that exited by itself (as
        a leader whose broker failed does) is restarted, and counted."""
        deadline = time.monotonic() + wait_s
        while not self.nodes.converged(at_least=0):
            self._restart_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the nodes did not settle within {wait_s} s: {self.nodes}")
            time.sleep(0.05)

    def _restart_exited(self) -> None:
        """Restart, and count, every node that exited by itself (not paused,
        not killed by the nemesis), as a supervisor would."""
        for node in self.nodes.ids:
            if not self.nodes.alive(node) and node not in self.nodes.paused:
                log(f"{node} had exited by itself ({self.nodes.servers[node].proc.returncode}): restarted")
                self.exited[node] = self.exited.get(node, 0) + 1
                self.nodes.restart(node)

    def _leader(self) -> tuple[str, int]:
        return self.nodes.wait_leader()

    def _failover(self, old: str, term: int) -> float:
        """Seconds from now (the fault) until another node leads a higher term."""
        started = time.monotonic()
        self.nodes.wait_leader(exclude=old, above_term=term, wait_s=30)
        return round(time.monotonic() - started, 3)

    def _recover(self, started: float) -> float:
        """Seconds from `started` (the heal: a restart begun, SIGCONT, the
        links back) until every node names one leader and holds the log
        the leader had once it was found."""
        leader, _ = self.nodes.wait_leader(wait_s=60)
        end = self.nodes.log_ends().get(leader) or 0
        while not self.nodes.converged(at_least=end):
            self._restart_exited()
            if time.monotonic() - started > 120:
                raise TimeoutError(f"not converged 120 s after a heal: {self.nodes} {self.nodes.log_ends()}")
            time.sleep(0.02)
        return round(time.monotonic() - started, 3)

    def _kill(self) -> FaultRecord:
        leader, term = self._leader()
        node = self.rng.choice(self.nodes.ids)
        start = now_ms()
        self.nodes.kill(node)
        failover = self._failover(node, term) if node == leader and self.nodes.cluster else None
        time.sleep(self.rng.uniform(0, 2) if self.nodes.cluster else 0)
        healed, started = now_ms(), time.monotonic()
        self.nodes.restart(node)
        return FaultRecord(Fault("kill", node, node == leader, start, healed), failover, self._recover(started))

    def _pause(self) -> FaultRecord:
        leader, term = self._leader()
        start = now_ms()
        self.nodes.pause(leader)
        try:
            failover = self._failover(leader, term)
            time.sleep(max(0.0, self.rng.uniform(*self.settings.pause_s) - failover))
        finally:
            healed, started = now_ms(), time.monotonic()
            self.nodes.resume(leader)
        return FaultRecord(Fault("pause", leader, True, start, healed), failover, self._recover(started))

    def _partition(self) -> FaultRecord:
        assert self.nodes.mesh is not None
        leader, term = self._leader()
        node = leader if self.rng.random() < 0.5 else self.rng.choice([n for n in self.nodes.ids if n != leader])
        mode = self.rng.choice([Mode.BLACKHOLE, Mode.DROP, Mode.DELAY])
        delay_ms = self.rng.randint(20, 200) if mode is Mode.DELAY else 0
        start = now_ms()
        self.nodes.mesh.isolate(node, mode, delay_ms)
        failover = None
        try:
            if node == leader and mode is not Mode.DELAY:
                failover = self._failover(leader, term)
            time.sleep(max(0.0, self.rng.uniform(*self.settings.partition_s) - (failover or 0)))
        finally:
            healed, started = now_ms(), time.monotonic()
            self.nodes.mesh.heal()
        note = f"{mode.value}{f' {delay_ms} ms' if delay_ms else ''}"
        return FaultRecord(Fault(f"partition_{mode.value}", node, node == leader, start, healed), failover,
                           self._recover(started), note)

    def _full_disk(self) -> FaultRecord:
        node = self.nodes.small_disk
        assert node is not None
        leader, _ = self._leader()
        start = now_ms()
        try:
            filled = self.nodes.fill_disk(node)
            time.sleep(self.settings.full_disk_s)
        finally:
            self.nodes.free_disk(node)
        healed, started = now_ms(), time.monotonic()
        note = f"{filled >> 20} MiB of ballast"
        if not self.nodes.alive(node):
            note += "; the node had exited by itself and was restarted"
            self.nodes.restart(node)
        return FaultRecord(Fault("full_disk", node, node == leader, start, healed), None, self._recover(started),
                           note)

    def _slow_disk(self) -> FaultRecord:
        leader, _ = self._leader()
        followers = [n for n in self.nodes.ids if n != leader]
        node = leader if not followers or self.rng.random() < 0.5 else self.rng.choice(followers)
        delay_ms = self.rng.randint(*self.settings.slow_disk_ms)
        start = now_ms()
        self.nodes.slow_disk(node, delay_ms)
        try:
            time.sleep(self.rng.uniform(*self.settings.slow_disk_s))
        finally:
            healed, started = now_ms(), time.monotonic()
            self.nodes.slow_disk(node, 0)
        note = f"{delay_ms} ms a fsync"
        now = self.nodes.leader()
        if self.nodes.cluster and now is not None and now[0] != leader:
            note += f"; {now[0]} leads now (term {now[1]})"
        return FaultRecord(Fault("slow_disk", node, node == leader, start, healed), None, self._recover(started),
                           note)


def _spread(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"count": len(ordered), "p50": percentile(ordered, 0.5), "max": percentile(ordered, 1.0)}


async def _drain(workload: Workload, wait_s: float, max_s: float) -> bool:
    """Until every message sent is delivered (or deleted, or rescheduled past
    the bound): at most `wait_s` after the last is due, or after the
    consumers last took a message, whichever is later (a backlog the
    consumers are still working through is not lost), and `max_s` in all.
    False if it stopped at `max_s` (what is missing then counts as lost)."""
    history = workload.history
    started = time.monotonic()
    last_due_s = started + max(0.0, (max((s.trigger_ms for s in history.sent), default=0) - now_ms()) / 1000)
    delivered, progress_s = len(history.deliveries), started
    while time.monotonic() < max(last_due_s, progress_s) + wait_s:
        if time.monotonic() - started > max_s:
            log(f"drain stopped after {max_s:.0f} s with messages still missing")
            return False
        await asyncio.sleep(1.0)
        history.end_ms = now_ms()
        if not await asyncio.to_thread(count_lost, history):
            return True
        if len(history.deliveries) > delivered:
            delivered, progress_s = len(history.deliveries), time.monotonic()
    return True


async def _lost_statuses(workload: Workload, examples: list[str]) -> dict[str, int]:
    """getMsg's status of the first 100 lost messages ("missing" when
    unknown; the error's name when unanswered), within 30 s in all."""
    counts: Counter[str] = Counter()
    lost = {(s.topic, s.msg_id) for s in workload.history.sent} - {(d.topic, d.msg_id)
                                                                 for d in workload.history.deliveries}
    deleted = {(o.topic, o.msg_id) for o in workload.history.ops if o.kind == "delete"}
    async with DelayQueueClient(workload.nodes.urls, timeout_s=2.0, retries=2, max_backoff_s=0.2) as client:
        async def ask_each() -> None:
            for topic, msg_id in sorted(lost - deleted)[:100]:
                try:
                    m = await client.get(topic, msg_id)
                    counts["missing" if m is None else str(int(m.status))] += 1
                except Exception as e:
                    counts[type(e).__name__] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ask_each(), 30)
    return dict(counts)


async def drive(nodes: Nodes, settings: Settings) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    workload = Workload(nodes, settings, random.Random(rng.random()))
    workload.history.pulls_durable = nodes.cluster
    nemesis = Nemesis(nodes, settings, random.Random(rng.random()), workload.history)
    started = time.monotonic()
    consumers = [asyncio.create_task(workload.consume(i)) for i in range(settings.consumers)]
    producer = asyncio.create_task(workload.produce())
    nemesis_error = None
    try:
        await nemesis.run(started + settings.budget_s)
    except Exception as e:  # reported: the nodes did not recover
        nemesis_error = repr(e)
        log(f"nemesis stopped: {nemesis_error}")
    faults_s = time.monotonic() - started
    await asyncio.sleep(1.0)
    workload.producing = False
    await producer
    load_s = time.monotonic() - started
    ops_under_load = sum(workload.operations.values())
    log(f"faults done in {faults_s:.0f} s; draining")
    drain_started = time.monotonic()
    drained = await _drain(workload, 30.0, settings.drain_max_s)
    drain_s = round(time.monotonic() - drain_started, 1)
    workload.consuming = False
    await asyncio.gather(*consumers)
    converge_started = time.monotonic()
    converged = await asyncio.to_thread(_converge, nodes, settings.settle_s)
    converge_s = round(time.monotonic() - converge_started, 3) if converged else None
    workload.history.end_ms = now_ms()
    findings = check(workload.history)
    if settings.history_path:
        await asyncio.to_thread(_write_json, settings.history_path, dataclasses.asdict(workload.history))
    terms: dict[int, set[str]] = {}
    for line in nodes.leaderships():
        if line.get("event") == "start":
            terms.setdefault(int(line["term"]), set()).add(str(line["node"]))
    double = sorted(t for t, led in terms.items() if len(led) > 1)
    records = nemesis.records
    report: dict[str, Any] = {
        "mode": "cluster" if nodes.cluster else "standalone",
        "seed": settings.seed,
        "faults": dict(Counter(r.fault.kind for r in records)),
        "faults_on_leader": sum(1 for r in records if r.fault.was_leader),
        "faults_skipped": nemesis.skipped,
        "nodes_exited": nemesis.exited,
        "failover_s": _spread([r.failover_s for r in records if r.failover_s is not None]),
        "recover_s": _spread([r.recover_s for r in records if r.recover_s is not None]),
        "operations": ops_under_load,
        "operations_by_kind": dict(workload.operations),
        "ops_per_s": round(ops_under_load / load_s, 1),
        "sends_attempted": workload.history.send_attempts,
        "sends_ok": len(workload.history.sent),
        "deliveries": len(workload.history.deliveries),
        **findings.as_dict(),
        "double_leader_terms": double,
        "converged": converged,
        "converge_s": converge_s,
        "drain_s": drain_s,
        "drain_bounded": not drained,
        "nemesis_error": nemesis_error,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if findings.lost:
        report["lost_status"] = await _lost_statuses(workload, findings.examples.get("lost", []))
    report["failed"] = findings.failed + (["double_leader_terms"] if double else []) + \
        ([] if converged else ["converged"]) + (["nemesis_error"] if nemesis_error else [])
    return report


def _write_json(path: str, value: object) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _converge(nodes: Nodes, wait_s: float) -> bool:
    """One leader, every node at the same log end, within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if nodes.converged():
            return True
        time.sleep(0.05)
    return False


def replay_command(argv: list[str], seed: int) -> str:
    rest = [a for i, a in enumerate(argv) if a != "--seed" and (i == 0 or argv[i - 1] != "--seed")]
    return " ".join([".venv/bin/python bench/drills.py", *rest, "--seed", str(seed)])


def parse_args(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--standalone", action="store_true", help="one node instead of a 3-node cluster")
    p.add_argument("--seed", type=int, default=None, help="the nemesis and workload seed (default: random, printed)")
    p.add_argument("--rate", type=int, default=d.rate, help=f"producer operations a second (default {d.rate})")
    p.add_argument("--consumers", type=int, default=d.consumers, help=f"long-polling consumers (default {d.consumers})")
    p.add_argument("--max-delay-s", type=float, default=d.max_delay_s,
                   help=f"the longest delay a send asks for (default {d.max_delay_s:g})")
    for name in ("kills", "pauses", "partitions", "full_disks", "slow_disks"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name),
                       help=f"faults of this kind (default {getattr(d, name)})")
    p.add_argument("--gap-s", type=float, nargs=2, default=d.gap_s, help="random pause between faults (min max)")
    p.add_argument("--small-disk-mb", type=int, default=d.small_disk_mb,
                   help=f"with --full-disks: the tmpfs of one node's data directory (default {d.small_disk_mb})")
    p.add_argument("--budget-s", type=float, default=d.budget_s,
                   help=f"no fault starts after this many seconds (default {d.budget_s:g})")
    p.add_argument("--drain-max-s", type=float, default=d.drain_max_s,
                   help=f"stop waiting for the last deliveries after this many seconds (default {d.drain_max_s:g})")
    p.add_argument("--root", default=None, help="work directory (default: a fresh temp dir, removed after)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (node logs, data)")
    p.add_argument("--history", default=None, help="write the whole history to this file (JSON)")
    p.add_argument("--recheck", default=None, metavar="HISTORY",
                   help="run nothing: check a history --history wrote, and print the checker's counts")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    settings = Settings(cluster=not args.standalone, seed=seed, rate=args.rate, consumers=args.consumers,
                        max_delay_s=args.max_delay_s, kills=args.kills, pauses=args.pauses,
                        partitions=args.partitions, full_disks=args.full_disks, slow_disks=args.slow_disks,
                        gap_s=tuple(args.gap_s), small_disk_mb=args.small_disk_mb, budget_s=args.budget_s,
                        drain_max_s=args.drain_max_s, root=args.root, keep=args.keep,
                        history_path=args.history)
    return settings, args


def run(settings: Settings) -> dict[str, Any]:
    """One drill: start the nodes, drive, check, stop every process."""
    root = settings.root or tempfile.mkdtemp(prefix="hourglass-drill-")
    nodes = Nodes.start(root, cluster=settings.cluster,
                        small_disk_mb=settings.small_disk_mb if settings.full_disks else 0,
                        slow_disks=settings.slow_disks > 0)
    try:
        report = asyncio.run(drive(nodes, settings))
    finally:
        nodes.stop()
        if not settings.keep:
            shutil.rmtree(root, ignore_errors=True)
    report["root"] = root if settings.keep else None
    return report


def recheck(path: str) -> int:
    """The checker's counts over a saved history (the checker as it is now,
    the history as the run recorded it); 1 if one that must be 0 is not."""
    with open(path) as f:
        findings = check(History.from_dict(json.load(f)))
    print(json.dumps({"history": path, **findings.as_dict(), "failed": findings.failed}, indent=1))
    return 1 if findings.failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings, args = parse_args(argv)
    if args.recheck:
        return recheck(args.recheck)
    unwind_on_signals()
    log(f"seed {settings.seed}")
    report = run(settings)
    report["replay"] = replay_command(argv, settings.seed)
    print(json.dumps(report, indent=1))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
