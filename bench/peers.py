"""hourglass against its peers in ONE run: hourglass (`serve --fsync
batch`), a Redis sorted-set queue in the Dyno-queues / camellia-delay-queue
layout (with its mover process) at `appendfsync always` and at `everysec`,
and beanstalkd at `-f 0` and at its default, side by side on this
machine's loopback. Prints ONE JSON object on stdout, and a table of every
figure, the ratios and the targets on stderr at the end (progress goes to
stderr too).

    .venv/bin/python bench/peers.py                          # every scenario, issue sizes (long: the lag step
                                                             # sends and drains 1,000,000 messages per system)
    .venv/bin/python bench/peers.py --ten-million            # the same and the ten-million lag (hourglass)
    .venv/bin/python bench/peers.py --quick                  # tiny sizes: a smoke test (about a minute)
    .venv/bin/python bench/peers.py --scenarios dispatch,burst --systems hourglass,redis_always
    .venv/bin/python bench/peers.py --hourglass-args="--some-flag 1"   # extra flags for hourglass serve
    .venv/bin/python bench/peers.py --hourglass-python .venv/bin/python  # the installed build, not the tree
    .venv/bin/python bench/peers.py --report peers.json      # the table of an earlier run's JSON again

Systems (--systems, all by default), durable peers first:
  hourglass      serve --fsync batch: a 200 comes after the fsync
  redis_always   Redis, AOF appendfsync always: the answer after the fsync
  beanstalkd_f0  beanstalkd -f 0: the answer after the fsync
  redis          Redis, AOF appendfsync everysec (its usual setting)
  beanstalkd     beanstalkd with no -f: its default, fsync at most every
                 50 ms (--beanstalkd-fsync-ms gives another period)
The first three make hourglass's promise (an answered write survives a
crash of the machine); the last two are the peers as usually run. In
ingest-batch each Redis also runs a second time sending one Lua call a
batch (`redis_always_lua`, `redis_lua`).

Every scenario runs on each system in turn, on a fresh server: started here
on 127.0.0.1 (a free port, a new data dir under --work-dir) and stopped by
PID at its end (SIGTERM, SIGKILL after 15 s). bench/peer_systems.py says
how each system is driven and what a "request" is. Producers and consumers
are processes of their own (fork), each with its own connections, waiting
at a common gate; every message carries a --payload-bytes (100) payload
that names it and its trigger time.

  ingest-batch  --ingest-batch-msgs (200,000) in calls of --batch-size
                (100) from --producers (4), delays uniform in 1 min..1 h,
                each call encoded before the clock starts. Redis twice:
                pipelined HSET+ZADD and one Lua call a batch (`_lua`).
  ingest-single --ingest-single-msgs (20,000), one message a call.
  dispatch      --dispatch-msgs (20,000) due uniformly over
                --dispatch-window-s (10) starting --lead-s (3) after the
                gate; producers send everything first (in batches) while
                --consumers (4) long-poll --pull-batch (10) at a time and
                ack each message with a request of its own (camellia's
                SDK), on --ack-connections (2) connections per consumer,
                at most --max-unacked (100) unacked per consumer.
  dispatch-keyed  hourglass only: dispatch with every message given one of
                --dispatch-keys (100) serial keys (sendMsg's `key`: one
                message of a key consumed at a time); its lateness is held
                to the peers' unkeyed dispatch.
  burst         the same with --burst-msgs (20,000) due within
                --burst-window-s (1); then again acking each pull's
                messages with one request (hourglass: ackMsg msgIds;
                "unsupported" when the server does not take it).
  roundtrip     --roundtrip-iters (2,000) sequential: a long poll waits,
                a message with delay 0 is sent, the poll receives it.
  lag           --lag-msgs (1,000,000) come due with no consumer; RSS;
                SIGKILL and restart, timed until a pull answers and the
                counts are whole; then --consumers drain them
                (--lag-pull-batch 100, acks per --lag-ack: one a message).
  lag-10m       the same with --ten-million-msgs (10,000,000), on the
                systems of --ten-million-systems (hourglass); without the
                drain unless --ten-million-drain. Only run when named or
                with --ten-million.
  engine        hourglass only: bench/engine.py (the storage engine in
                process) with --engine-msgs (1,000,000), its append rate.
  spark         hourglass only: bench/spark_ingest.py (the Spark sink into
                a real serve --fsync batch) with --spark-rows (500,000);
                skipped when pyspark or java is missing.

Figures (`figures.<system>`; rates are msgs/s, times ms unless _s):
  ingest_batch_msgs_per_s, ingest_single_msgs_per_s   answered messages /
      (last producer done - first started)
  <scenario>_server_cpu_us_per_msg / _per_request    the server's own
      utime+stime (/proc/<pid>/stat) over the phase, per message and per
      request; Redis: redis-server + mover, the mover also alone as
      <scenario>_mover_cpu_us_per_msg
  dispatch_delivered_per_s    distinct messages received / (last receipt -
      earliest trigger); dispatch_keyed_*, burst_*, burst_batch_ack_*
      likewise
  dispatch_lateness_ms_p50/p99/max   receive time - trigger time, over every
      receipt; _early (received before the trigger), _lost (not received
      once past the last trigger nothing came for --grace-s),
      _duplicates (receipts beyond the first)
  roundtrip_ms_p50 / p99     send start to the poll's answer;
      roundtrip_server_cpu_us_per_msg: server CPU a trip (send, pull, ack)
  lag_rss_mb (+ lag_mover_rss_mb), lag_restart_s, lag_rss_after_restart_mb,
      lag_drain_msgs_per_s (N / (last ack - consumers' start)),
      lag_drain_server_cpu_us_per_msg / _per_request, lag_lost,
      lag_duplicates; lag_10m_* the same at ten million
  engine_append_msgs_per_s, engine_append_near_msgs_per_s,
      engine_reopen_s, engine_disk_bytes_per_msg   bench/engine.py's
  spark_rows_per_s, spark_server_cpu_us_per_row   bench/spark_ingest.py's
`ratios.hourglass_over_<peer>`: hourglass's figure / the peer's (above 1
means hourglass's is larger); `better.<peer>`: for each figure, which
system's is better (a rate: the larger; a time, a size or CPU: the
smaller), or "same". `targets`: issue 28's targets checked against this
run, each with its limit or the peer figure it is held to and `met`.
`scenarios.<scenario>.<system>`: every detail (request latencies, client
CPU, counts, the mover's ticks, errors). `problems`: anything a system got
wrong (early, lost, duplicate, an error answer), with evidence; the exit
status is then 1.

Not like for like (read before quoting): `redis` and `beanstalkd` answer
before the fsync (AOF everysec, binlog every 50 ms), hourglass,
`redis_always` and `beanstalkd_f0` after it; beanstalkd's delays are whole
seconds (its lateness against its own deadline is
`lateness_effective_ms_*` in the details); Redis and beanstalkd keep every
message in RAM; the Redis "system" has no HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import multiprocessing
import os
import queue
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from array import array
from dataclasses import dataclass

import http_load
from harness import ROOT, CpuMeter, child_env, own_cpu_s, percentile, unwind_on_signals, wait_until
from http_load import calibration_ms, log, machine_info, source_state
from peer_systems import (
    CLIENT_ERRORS,
    BeanstalkdSystem,
    HourglassSystem,
    RedisSystem,
    System,
    decode_payload,
    make_client,
    now_ms,
)

SCENARIOS = ("ingest-batch", "ingest-single", "dispatch", "dispatch-keyed", "burst", "roundtrip", "lag", "lag-10m",
             "engine", "spark")
# What a run without --scenarios does: everything but the ten-million lag (--ten-million adds it).
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s != "lag-10m")
# Scenarios of hourglass alone: serial keys are its own, engine and spark measure its parts.
HOURGLASS_ONLY = ("dispatch-keyed", "engine", "spark")
# Scenarios that run another benchmark of this folder rather than a server here.
TOOLS = ("engine", "spark")
SYSTEMS = ("hourglass", "hourglass_1", "redis_always", "beanstalkd_f0", "redis", "beanstalkd")
# The peers that make hourglass's promise (the answer after the fsync), and the peers as usually run.
DURABLE_PEERS = ("redis_always", "redis_always_lua", "beanstalkd_f0")
DEFAULT_PEERS = ("redis", "redis_lua", "beanstalkd")
EVIDENCE = 5
# Sizes of --quick (every one can still be given as a flag).
QUICK = {"ingest_batch_msgs": 2_000, "ingest_single_msgs": 200, "dispatch_msgs": 300, "dispatch_window_s": 0.5,
         "lead_s": 1.0, "burst_msgs": 300, "burst_window_s": 0.2, "lag_msgs": 2_000, "ten_million_msgs": 3_000,
         "lag_send_batch": 200, "lag_lead_s": 0.3, "lag_window_s": 0.5, "settle_s": 0.3, "roundtrip_iters": 30,
         "roundtrip_warmup": 5, "grace_s": 3.0, "poll_timeout_ms": 500, "engine_msgs": 5_000, "spark_rows": 2_000, "spark_warmup_rows": 200}


def run_coroutine(coroutine):
    """asyncio.run, on uvloop when it is installed (a cheaper client)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# --- worker processes ----------------------------------------------------------------


class Gate:
    """The common start of a phase's processes: each sets itself up
    (connects, encodes), then all pass at once and learn the start time
    (ms epoch) the parent chose as they passed."""

    def __init__(self, ctx, parties: int) -> None:
        self.barrier = ctx.Barrier(parties + 1)
        self.start = ctx.Value("q", 0)

    def wait(self, timeout_s: float = 600) -> int:
        """In a child: ready; returns the start time. It blocks the child's
        event loop, which has nothing else to do yet."""
        self.barrier.wait(timeout_s)
        self.barrier.wait(timeout_s)
        return self.start.value

    def open(self, timeout_s: float = 600) -> int:
        """In the parent: once every child is ready, start them."""
        self.barrier.wait(timeout_s)
        self.start.value = now_ms()
        self.barrier.wait(timeout_s)
        return self.start.value


@dataclass
class Shared:
    """What a phase's processes share: the gate, a stop flag the parent
    sets, and running counts of messages sent and received."""
    gate: Gate
    stop: object
    sent: object
    received: object


def _child(job, kwargs: dict, shared: Shared, results, slot: int) -> None:
    cpu_before = own_cpu_s()
    try:
        result = run_coroutine(job(shared, **kwargs))
    except BaseException:
        shared.gate.barrier.abort()
        result = {"fatal": traceback.format_exc()[-3000:]}
    result["client_cpu_s"] = round(own_cpu_s() - cpu_before, 2)
    results.put((slot, result))


@dataclass
class TriggerSpec:
    """Trigger times of a producer's messages: `base + uniform(low_ms,
    high_ms)`, where base is the moment of encoding when the producer
    encodes before the gate (ingest), else the gate's start."""
    low_ms: int
    high_ms: int
    seed: int

    def triggers(self, indices, base_ms: int, rng: random.Random) -> list[tuple[int, int]]:
        return [(i, base_ms + rng.randint(self.low_ms, self.high_ms)) for i in indices]


async def producer(shared: Shared, config: dict, payload_bytes: int, indices: range, spec: TriggerSpec,
                   batch_size: int, pre_encode: bool) -> dict:
    """Send `indices` in calls of `batch_size` on one connection, one call
    at a time. With `pre_encode` every call is encoded before the gate."""
    client = make_client(config, payload_bytes)
    await client.connect()
    rng = random.Random(spec.seed)
    batches = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    prepared = []
    if pre_encode:
        now = now_ms()
        prepared = [client.prepare(spec.triggers(batch, now, rng), now) for batch in batches]
    start_ms = shared.gate.wait()
    latencies_ms, errors = array("d"), []
    sent = sent_after_trigger = 0
    started = time.time()
    for number, batch in enumerate(batches):
        if pre_encode:
            msgs, body = None, prepared[number]
        else:
            msgs = spec.triggers(batch, start_ms, rng)
            body = client.prepare(msgs, now_ms())
        asked = time.perf_counter()
        try:
            await client.send(body)
        except CLIENT_ERRORS as e:
            errors.append({"request": getattr(e, "request", "send"), "answer": getattr(e, "answer", repr(e))})
            if len(errors) >= EVIDENCE:
                break
            continue
        latencies_ms.append((time.perf_counter() - asked) * 1000)
        sent += len(batch)
        if msgs is not None:
            answered = now_ms()
            sent_after_trigger += sum(1 for _, trigger in msgs if trigger < answered)
        with shared.sent.get_lock():
            shared.sent.value += len(batch)
    ended = time.time()
    await client.close()
    return {"sent": sent, "started": started, "ended": ended, "latencies_ms": latencies_ms, "errors": errors,
            "sent_after_trigger": sent_after_trigger}


async def consumer(shared: Shared, config: dict, payload_bytes: int, ack_timeout_ms: int, target: int,
                   pull_batch: int, poll_timeout_s: float, ack_mode: str, max_unacked: int, ack_connections: int,
                   count_from_offset_ms: int, limit_s: float) -> dict:
    """Long-poll `pull_batch` at a time until `target` messages were
    received by all consumers together, the parent says stop, or
    `limit_s`. Acks: each message alone (`single`) or each pull's at once
    (`batch`); from tasks of their own on connections of their own, so
    the poll loop pulls again at once (as camellia's SDK hands messages to
    a worker pool), but at most `max_unacked` waiting for their ack. On
    beanstalkd, whose jobs are deleted on the connection that reserved
    them, acks go in line before the next pull. Requests started before
    start + `count_from_offset_ms` are not counted (idle polls before the
    first trigger)."""
    client = make_client(config, payload_bytes, ack_timeout_ms)
    await client.connect()
    ackers = [] if client.acks_inline else [await client.acker() for _ in range(ack_connections)]
    start_ms = shared.gate.wait()
    count_from_ms = start_ms + count_from_offset_ms
    deadline = time.monotonic() + limit_s
    indices, lateness, lateness_effective = array("q"), array("d"), array("d")
    stats = {"pulls": 0, "empty_pulls": 0, "ack_requests": 0, "acked": 0, "first_receive_ms": None,
             "last_receive_ms": None, "last_ack_ms": None, "min_trigger_ms": None, "errors": []}
    work: asyncio.Queue = asyncio.Queue()
    room = asyncio.Event()
    room.set()
    unacked = 0

    def error(e: Exception) -> None:
        if len(stats["errors"]) < EVIDENCE:
            stats["errors"].append({"request": getattr(e, "request", "?"), "answer": getattr(e, "answer", repr(e))})

    async def ack(acker, handles) -> None:
        nonlocal unacked
        try:
            if ack_mode == "batch":
                await acker.ack_many(handles)
            else:
                await acker.ack_one(handles[0])
        except CLIENT_ERRORS as e:
            error(e)
        else:
            stats["acked"] += len(handles)
        stats["ack_requests"] += 1
        stats["last_ack_ms"] = now_ms()
        unacked -= len(handles)
        if unacked < max_unacked:
            room.set()

    async def ack_worker(acker) -> None:
        while (handles := await work.get()) is not None:
            await ack(acker, handles)

    workers = [asyncio.create_task(ack_worker(a)) for a in ackers]
    while not shared.stop.is_set() and shared.received.value < target and time.monotonic() < deadline:
        while unacked >= max_unacked:
            room.clear()
            await room.wait()
        asked_ms = now_ms()
        try:
            items = await client.pull(pull_batch, poll_timeout_s)
        except CLIENT_ERRORS as e:
            error(e)
            await asyncio.sleep(0.05)
            continue
        received_ms = time.time() * 1000
        if asked_ms >= count_from_ms:
            stats["pulls"] += 1
        if not items:
            stats["empty_pulls"] += 1
            continue
        with shared.received.get_lock():
            shared.received.value += len(items)
        if stats["first_receive_ms"] is None:
            stats["first_receive_ms"] = received_ms
        stats["last_receive_ms"] = received_ms
        handles = []
        for handle, payload in items:
            index, trigger_ms, effective_ms = decode_payload(payload)
            indices.append(index)
            lateness.append(received_ms - trigger_ms)
            lateness_effective.append(received_ms - effective_ms)
            if stats["min_trigger_ms"] is None or trigger_ms < stats["min_trigger_ms"]:
                stats["min_trigger_ms"] = trigger_ms
            handles.append(handle)
        groups = [handles] if ack_mode == "batch" else [[h] for h in handles]
        if client.acks_inline:
            for group in groups:
                unacked += len(group)
                await ack(client, group)
        else:
            unacked += len(handles)
            for group in groups:
                work.put_nowait(group)
    for _ in workers:
        work.put_nowait(None)
    await asyncio.gather(*workers)
    for acker in ackers:
        if acker is not client:
            await acker.close()
    await client.close()
    return {"indices": indices, "lateness_ms": lateness, "lateness_effective_ms": lateness_effective, **stats}


async def roundtrip(shared: Shared, config: dict, payload_bytes: int, iters: int, warmup: int) -> dict:
    """One producer and one consumer connection: each trip starts a long
    poll, lets it reach the server (5 ms), sends one message due now and
    times send start -> the poll's answer."""
    producer_client = make_client(config, payload_bytes)
    consumer_client = make_client(config, payload_bytes)
    await producer_client.connect()
    await consumer_client.connect()
    shared.gate.wait()
    trips_ms, sends_ms, lost, errors, made = array("d"), array("d"), 0, [], 0
    for i in range(warmup + iters):
        made += 1
        poll = asyncio.ensure_future(consumer_client.pull(1, 2.0))
        await asyncio.sleep(0.005)
        now = now_ms()
        body = producer_client.prepare([(i, now)], now)
        asked = time.perf_counter()
        try:
            await producer_client.send(body)
            sent = time.perf_counter()
            items = await poll
            answered = time.perf_counter()
            if items:
                await consumer_client.ack_one(items[0][0])
        except CLIENT_ERRORS as e:
            errors.append({"request": getattr(e, "request", "?"), "answer": getattr(e, "answer", repr(e))})
            if len(errors) >= EVIDENCE:
                break
            continue
        if not items or decode_payload(items[0][1])[0] != i:
            lost += 1
            continue
        if i >= warmup:
            trips_ms.append((answered - asked) * 1000)
            sends_ms.append((sent - asked) * 1000)
    await producer_client.close()
    await consumer_client.close()
    return {"trips_ms": trips_ms, "sends_ms": sends_ms, "lost": lost, "errors": errors, "trips_made": made}


def run_phase(label: str, jobs: list[tuple], limit_s: float, on_open=None, watch=None) -> tuple[int, list[dict]]:
    """Fork one process per (coroutine function, kwargs) of `jobs`, open
    the gate once all are set up (then call `on_open()`), and collect
    their results (in job order). `watch(start_ms, shared)` is called
    every 50 ms meanwhile (it may set shared.stop). After `limit_s` the
    processes are told to stop, and killed 60 s later."""
    ctx = multiprocessing.get_context("fork")
    shared = Shared(Gate(ctx, len(jobs)), ctx.Event(), ctx.Value("q", 0), ctx.Value("q", 0))
    results_queue = ctx.Queue()
    children = [ctx.Process(target=_child, args=(job, kwargs, shared, results_queue, slot), daemon=True)
                for slot, (job, kwargs) in enumerate(jobs)]
    for child in children:
        child.start()
    results: dict[int, dict] = {}
    try:
        try:
            start_ms = shared.gate.open()
        except threading.BrokenBarrierError:
            raise RuntimeError(f"{label}: a process failed while setting up: "
                               f"{_first_fatal(results_queue)}") from None
        if on_open is not None:
            on_open()
        deadline = time.monotonic() + limit_s
        next_log = time.monotonic() + 10
        while len(results) < len(children):
            try:
                slot, result = results_queue.get(timeout=0.05)
                results[slot] = result
                continue
            except queue.Empty:
                pass
            if watch is not None:
                watch(start_ms, shared)
            if time.monotonic() > next_log:
                next_log += 10
                log(f"{label}: sent {shared.sent.value:,}, received {shared.received.value:,}")
            if time.monotonic() > deadline:
                shared.stop.set()
            if time.monotonic() > deadline + 60:
                raise RuntimeError(f"{label}: processes still running {limit_s + 60} s after the start")
            dead = [c.exitcode for i, c in enumerate(children) if i not in results and c.exitcode is not None]
            if dead and results_queue.empty():
                time.sleep(0.5)  # a result put just before exiting may still be in the pipe
                if results_queue.empty():
                    raise RuntimeError(f"{label}: a process exited without a result (exit codes {dead})")
    finally:
        shared.stop.set()
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
                child.join()
    fatal = [r["fatal"] for r in results.values() if "fatal" in r]
    if fatal:
        raise RuntimeError(f"{label}: a process failed: {fatal[0]}")
    return start_ms, [results[i] for i in range(len(children))]


def _first_fatal(results_queue) -> str:
    with contextlib.suppress(queue.Empty):
        return results_queue.get(timeout=2)[1].get("fatal", "?")
    return "no report"


# --- one run: every scenario on every system ---------------------------------------------


def shares(total: int, parts: int) -> list[range]:
    """0..total-1 split into `parts` interleaved ranges."""
    return [range(i, total, parts) for i in range(parts)]


def cpu_figures(prefix: str, cpu: dict[str, float], msgs: int, requests: int | None) -> tuple[dict, dict]:
    """(figures, details) from CpuMeter's seconds: server CPU per message
    and per request, Redis's mover included in both and also alone."""
    total = sum(v for k, v in cpu.items() if k.endswith("_cpu_s"))  # (a shard's share is within the server's)
    figures = {f"{prefix}_server_cpu_us_per_msg": rounded(total / msgs * 1e6) if msgs else None}
    if requests:
        figures[f"{prefix}_server_cpu_us_per_request"] = rounded(total / requests * 1e6)
    if "mover_cpu_s" in cpu and msgs:
        figures[f"{prefix}_mover_cpu_us_per_msg"] = rounded(cpu["mover_cpu_s"] / msgs * 1e6)
    return figures, {**cpu, "total_server_cpu_s": round(total, 2), "requests": requests}


def receipts(results: list[dict], n: int) -> dict:
    """What consumers received, against the n messages 0..n-1 sent."""
    seen = bytearray(n)
    unknown = early = total = 0
    lateness, effective = array("d"), array("d")
    for r in results:
        total += len(r["indices"])
        for index in r["indices"]:
            if 0 <= index < n:
                seen[index] = min(255, seen[index] + 1)
            else:
                unknown += 1
        lateness.extend(r["lateness_ms"])
        effective.extend(r["lateness_effective_ms"])
    distinct = n - seen.count(0)
    early = sum(1 for x in lateness if x < 0)
    lateness_sorted, effective_sorted = sorted(lateness), sorted(effective)
    firsts = [r["first_receive_ms"] for r in results if r["first_receive_ms"] is not None]
    lasts = [r["last_receive_ms"] for r in results if r["last_receive_ms"] is not None]
    acks = [r["last_ack_ms"] for r in results if r["last_ack_ms"] is not None]
    triggers = [r["min_trigger_ms"] for r in results if r["min_trigger_ms"] is not None]
    return {"received": total, "distinct": distinct, "lost": n - distinct, "duplicates": total - distinct - unknown,
            "unknown": unknown, "early": early,
            "lateness_ms_p50": percentile(lateness_sorted, 0.5), "lateness_ms_p99": percentile(lateness_sorted, 0.99),
            "lateness_ms_max": percentile(lateness_sorted, 1.0),
            "lateness_effective_ms_p50": percentile(effective_sorted, 0.5),
            "lateness_effective_ms_p99": percentile(effective_sorted, 0.99),
            "first_receive_ms": rounded(min(firsts, default=None)), "last_receive_ms": rounded(max(lasts, default=None)),
            "last_ack_ms": max(acks, default=None), "min_trigger_ms": min(triggers, default=None),
            "lost_examples": [i for i in range(n) if not seen[i]][:EVIDENCE] if distinct < n else [],
            "pulls": sum(r["pulls"] for r in results), "empty_pulls": sum(r["empty_pulls"] for r in results),
            "ack_requests": sum(r["ack_requests"] for r in results), "acked": sum(r["acked"] for r in results),
            "errors": [e for r in results for e in r["errors"]][:EVIDENCE]}


def latency_summary(results: list[dict], key: str = "latencies_ms") -> dict:
    values = sorted(x for r in results for x in r[key])
    return {"requests": len(values), "request_ms_p50": percentile(values, 0.5),
            "request_ms_p99": percentile(values, 0.99)}


class Bench:
    def __init__(self, args: argparse.Namespace, work_dir: str) -> None:
        self.args = args
        self.work_dir = work_dir
        self.figures: dict[str, dict] = {}
        self.details: dict[str, dict] = {}
        self.problems: list[dict] = []
        self.failed = False
        self.described: dict[str, dict] = {}

    # -- systems --------------------------------------------------------------------

    def systems(self, scenario: str) -> list[System]:
        """Fresh System objects for `scenario`, in the order of --systems:
        hourglass alone for its own scenarios, --ten-million-systems for
        the ten-million lag, each Redis twice in ingest-batch."""
        a = self.args
        names = [n for n in a.systems if n == "hourglass" or scenario not in HOURGLASS_ONLY]
        if scenario == "lag-10m":
            names = [n for n in names if n in a.ten_million_systems]
        out: list[System] = []
        for name in names:
            if name in ("hourglass", "hourglass_1"):
                keys = a.dispatch_keys if scenario == "dispatch-keyed" else a.keys
                extra = a.hourglass_args + (["--shards", "1"] if name == "hourglass_1" else [])
                out.append(HourglassSystem(self.work_dir, extra, keys, a.hourglass_python, name))
            elif name in ("redis", "redis_always"):
                appendfsync = "always" if name == "redis_always" else "everysec"
                sends = [("pipeline", name), ("lua", f"{name}_lua")] if scenario == "ingest-batch" else [
                    (a.redis_send, name)]
                out += [RedisSystem(self.work_dir, a.redis_server, appendfsync, a.tick_ms, a.move_limit,
                                    send, label) for send, label in sends]
            elif name == "beanstalkd_f0":
                out.append(BeanstalkdSystem(self.work_dir, a.beanstalkd, 0, name))
            elif name == "beanstalkd":
                out.append(BeanstalkdSystem(self.work_dir, a.beanstalkd, a.beanstalkd_fsync_ms, name))
        return out

    def problem(self, system: str, scenario: str, what: str, **evidence) -> None:
        log(f"PROBLEM {system} {scenario}: {what}")
        self.problems.append({"system": system, "scenario": scenario, "what": what, **evidence})

    @contextlib.contextmanager
    def serving(self, system: System, scenario: str, detail: dict):
        system.start(os.path.join(self.work_dir, scenario, system.name))
        log(f"{scenario}: {system.name} serving on 127.0.0.1:{system.port} (pids {system.pids()})")
        if system.name not in self.described:
            self.described[system.name] = system.describe()
        try:
            yield system
        finally:
            stopped = system.stop()
            detail.update(stopped)
            if "server_exit" in stopped:
                self.problem(system.name, scenario, f"the server exited {stopped['server_exit']} after SIGTERM "
                             "(None: it did not exit within 15 s and was killed)")

    def run(self) -> None:
        for scenario in self.args.scenarios:
            if scenario in TOOLS:
                self._run_tool(scenario)
                continue
            # burst runs twice, each time on fresh servers: acks one by one, then a pull's at once.
            for part in ([scenario, "burst-batch-ack"] if scenario == "burst" else [scenario]):
                self._run_part(scenario, part)

    def _run_tool(self, scenario: str) -> None:
        """engine or spark: the other benchmark as a child process (the
        worktree's code first on its path), its JSON kept whole in the
        details and its headline figures under hourglass's."""
        if "hourglass" not in self.args.systems:
            return
        log(f"=== {scenario} (hourglass)")
        started = time.monotonic()
        detail: dict = {}
        try:
            figures = getattr(self, scenario)(detail)
            if figures:
                self.figures.setdefault("hourglass", {}).update(figures)
            log(f"{scenario}: {json.dumps(figures)}")
        except Exception as e:
            self.failed = True
            detail["error"] = repr(e)
            log(f"{scenario} failed: {e!r}")
        detail["wall_s"] = round(time.monotonic() - started, 2)
        self.details.setdefault(scenario, {})["hourglass"] = detail

    def _bench_child(self, script: str, *argv: str) -> dict:
        """Run bench/<script> and return the JSON object it printed."""
        env = child_env(os.path.join(ROOT, "bench"))
        command = [sys.executable, os.path.join(ROOT, "bench", script), *argv]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=self.args.phase_limit_s)
        try:
            out = json.loads(done.stdout)
        except ValueError:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode} without its JSON: "
                               f"{done.stderr[-2000:]}") from None
        if done.returncode != 0:
            self.problem("hourglass", script, f"{script} exited {done.returncode}", problems=out.get("problems"))
        return out

    def engine(self, detail: dict) -> dict:
        a = self.args
        out = self._bench_child("engine.py", "--messages", str(a.engine_msgs), "--dir", self.work_dir)
        detail.update(out)
        reopen = next((v for k, v in out.items() if k.startswith("reopen_s_")), None)
        return {"engine_append_msgs_per_s": out["append_msgs_per_s"],
                "engine_append_near_msgs_per_s": out["append_near_msgs_per_s"],
                "engine_reopen_s": reopen, "engine_disk_bytes_per_msg": out["disk_bytes_per_msg"]}

    def spark(self, detail: dict) -> dict:
        a = self.args
        missing = [what for what, there in (("pyspark", importlib.util.find_spec("pyspark")),
                                            ("java", shutil.which("java"))) if not there]
        if missing:
            detail["skipped"] = f"{' and '.join(missing)} not installed"
            log(f"spark: skipped ({detail['skipped']})")
            return {}
        out = self._bench_child("spark_ingest.py", "--rows", str(a.spark_rows), "--warmup-rows",
                                str(a.spark_warmup_rows), "--work-dir", self.work_dir)
        detail.update(out)
        if out["counted"] != out["rows"]:
            self.problem("hourglass", "spark", f"wrote {out['rows']} rows, the server counts {out['counted']}")
        return {"spark_rows_per_s": out["rows_per_s"],
                "spark_server_cpu_us_per_row": rounded(out["receiver_cpu_s"] / out["rows"] * 1e6)}

    def _run_part(self, scenario: str, part: str) -> None:
        for system in self.systems(scenario):
            log(f"=== {part} on {system.name}")
            detail: dict = {}
            started = time.monotonic()
            try:
                with self.serving(system, part, detail):
                    figures = getattr(self, part.replace("-", "_"))(system, detail)
                self.figures.setdefault(system.name, {}).update(figures)
                log(f"{part} {system.name}: {json.dumps(figures)}")
            except Exception as e:
                self.failed = True
                detail["error"] = repr(e)
                log(f"{part} on {system.name} failed: {e!r}")
            detail["wall_s"] = round(time.monotonic() - started, 2)
            self.details.setdefault(part, {})[system.name] = detail

    # -- scenarios ------------------------------------------------------------------

    def _producer_jobs(self, system: System, n: int, batch_size: int, spec: TriggerSpec, pre_encode: bool) -> list:
        a = self.args
        return [(producer, {"config": system.client_config(), "payload_bytes": a.payload_bytes, "indices": part,
                            "spec": TriggerSpec(spec.low_ms, spec.high_ms, spec.seed + i),
                            "batch_size": batch_size, "pre_encode": pre_encode})
                for i, part in enumerate(shares(n, a.producers))]

    def _consumer_jobs(self, system: System, target: int, pull_batch: int, ack_mode: str,
                       count_from_offset_ms: int, limit_s: float) -> list:
        a = self.args
        return [(consumer, {"config": system.client_config(), "payload_bytes": a.payload_bytes,
                            "ack_timeout_ms": a.ack_timeout_ms, "target": target, "pull_batch": pull_batch,
                            "poll_timeout_s": a.poll_timeout_ms / 1000, "ack_mode": ack_mode,
                            "max_unacked": a.max_unacked, "ack_connections": a.ack_connections,
                            "count_from_offset_ms": count_from_offset_ms, "limit_s": limit_s})
                for _ in range(a.consumers)]

    def _check_sends(self, system: System, scenario: str, results: list[dict]) -> None:
        for r in results:
            for e in r["errors"]:
                self.problem(system.name, scenario, "error answer to a send", **e)

    def _ingest(self, system: System, detail: dict, scenario: str, n: int, batch_size: int) -> dict:
        a = self.args
        spec = TriggerSpec(a.ingest_min_delay_s * 1000, a.ingest_max_delay_s * 1000, seed=14)
        memory_before = system.memory()
        meter: list[CpuMeter] = []
        _, results = run_phase(f"{scenario} {system.name}", self._producer_jobs(system, n, batch_size, spec, True),
                               a.phase_limit_s, on_open=lambda: meter.append(CpuMeter(system.pids(), system.parts())))
        cpu = meter[0].used()
        self._check_sends(system, scenario, results)
        sent = sum(r["sent"] for r in results)
        seconds = max(r["ended"] for r in results) - min(r["started"] for r in results)
        counts = system.counts()
        if counts.waiting != sent:
            self.problem(system.name, scenario, f"{sent} sends answered, but the system counts {counts}")
        prefix = scenario.replace("-", "_")
        latency = latency_summary(results)
        cpu_figs, cpu_detail = cpu_figures(prefix, cpu, sent, latency["requests"])
        detail.update({"msgs": sent, "seconds": round(seconds, 3), **latency, **cpu_detail,
                       "client_cpu_s": round(sum(r["client_cpu_s"] for r in results), 2),
                       "counts_after": counts.__dict__, "memory_before": memory_before,
                       "memory_after": system.memory(), "disk_bytes": system.disk_bytes()})
        return {f"{prefix}_msgs_per_s": rounded(sent / seconds) if seconds else None, **cpu_figs,
                f"{prefix}_request_ms_p99": latency["request_ms_p99"]}

    def ingest_batch(self, system: System, detail: dict) -> dict:
        return self._ingest(system, detail, "ingest-batch", self.args.ingest_batch_msgs, self.args.batch_size)

    def ingest_single(self, system: System, detail: dict) -> dict:
        return self._ingest(system, detail, "ingest-single", self.args.ingest_single_msgs, 1)

    def _dispatch(self, system: System, detail: dict, scenario: str, n: int, window_s: float, ack_mode: str,
                  prefix: str) -> dict:
        """n messages due over window_s from lead_s after the start;
        consumers long-poll and ack; lateness, losses, rate, server CPU
        from the first trigger to the end."""
        a = self.args
        lead_ms, window_ms = int(a.lead_s * 1000), int(window_s * 1000)
        spec = TriggerSpec(lead_ms, lead_ms + window_ms, seed=18)
        jobs = (self._producer_jobs(system, n, a.batch_size, spec, False)
                + self._consumer_jobs(system, n, a.pull_batch, ack_mode, lead_ms, a.phase_limit_s))
        meter: list[CpuMeter] = []
        progress = [0, now_ms()]  # messages received, when that count last grew

        def watch(start_ms: int, shared: Shared) -> None:
            now = now_ms()
            if not meter and now >= start_ms + lead_ms:
                meter.append(CpuMeter(system.pids(), system.parts()))
            if shared.received.value != progress[0]:
                progress[:] = [shared.received.value, now]
            if now > start_ms + lead_ms + window_ms and now - progress[1] > a.grace_s * 1000:
                shared.stop.set()  # past the last trigger and nothing came for grace_s: the rest is lost

        start_ms, results = run_phase(f"{scenario} {system.name}", jobs, a.phase_limit_s, watch=watch)
        cpu = meter[0].used() if meter else {}
        sends, consumed = results[:a.producers], results[a.producers:]
        self._check_sends(system, scenario, sends)
        got = receipts(consumed, n)
        sent_after_trigger = sum(r["sent_after_trigger"] for r in sends)
        send_done_ms = max(r["ended"] for r in sends) * 1000
        for e in got["errors"]:
            self.problem(system.name, scenario, "error answer to a consumer", **e)
        for what in ("early", "lost", "duplicates", "unknown"):
            if got[what]:
                self.problem(system.name, scenario, f"{got[what]} {what}", examples=got["lost_examples"]
                             if what == "lost" else None, counts_after=system.counts().__dict__)
        delivered_s = ((got["last_receive_ms"] - got["min_trigger_ms"]) / 1000
                       if got["last_receive_ms"] and got["min_trigger_ms"] else None)
        requests = got["pulls"] + got["ack_requests"]
        cpu_figs, cpu_detail = cpu_figures(prefix, cpu, got["distinct"], requests)
        detail.update({"msgs": n, "window_s": window_s, "ack": ack_mode, "nominal_per_s": rounded(n / window_s),
                       "sent_after_trigger": sent_after_trigger,
                       "send_done_before_first_trigger_ms": round(start_ms + lead_ms - send_done_ms),
                       "send": latency_summary(sends), **{k: v for k, v in got.items() if k != "lost_examples"},
                       "all_acked_after_last_trigger_ms": rounded(got["last_ack_ms"] - (start_ms + lead_ms + window_ms))
                       if got["last_ack_ms"] else None, **cpu_detail,
                       "client_cpu_s": round(sum(r["client_cpu_s"] for r in results), 2)})
        return {f"{prefix}_delivered_per_s": rounded(got["distinct"] / delivered_s) if delivered_s else None,
                f"{prefix}_lateness_ms_p50": got["lateness_ms_p50"], f"{prefix}_lateness_ms_p99": got["lateness_ms_p99"],
                f"{prefix}_lateness_ms_max": got["lateness_ms_max"], f"{prefix}_early": got["early"],
                f"{prefix}_lost": got["lost"], f"{prefix}_duplicates": got["duplicates"], **cpu_figs}

    def dispatch(self, system: System, detail: dict) -> dict:
        a = self.args
        return self._dispatch(system, detail, "dispatch", a.dispatch_msgs, a.dispatch_window_s, "single", "dispatch")

    def dispatch_keyed(self, system: System, detail: dict) -> dict:
        """dispatch with --dispatch-keys serial keys (the system was made
        with them: systems())."""
        a = self.args
        detail["keys"] = a.dispatch_keys
        return self._dispatch(system, detail, "dispatch-keyed", a.dispatch_msgs, a.dispatch_window_s, "single",
                              "dispatch_keyed")

    def burst(self, system: System, detail: dict) -> dict:
        a = self.args
        return self._dispatch(system, detail, "burst", a.burst_msgs, a.burst_window_s, "single", "burst")

    def burst_batch_ack(self, system: System, detail: dict) -> dict:
        """burst again, each pull's messages acked with one request."""
        a = self.args
        if not system.supports_batch_ack():
            detail["unsupported"] = "ackMsg with msgIds did not ack (the server does not take it)"
            log(f"burst-batch-ack {system.name}: unsupported")
            return {"burst_batch_ack_delivered_per_s": "unsupported"}
        return self._dispatch(system, detail, "burst-batch-ack", a.burst_msgs, a.burst_window_s, "batch",
                              "burst_batch_ack")

    def lag(self, system: System, detail: dict) -> dict:
        return self._lag(system, detail, "lag", self.args.lag_msgs, drain=True)

    def lag_10m(self, system: System, detail: dict) -> dict:
        return self._lag(system, detail, "lag-10m", self.args.ten_million_msgs, drain=self.args.ten_million_drain)

    def _lag(self, system: System, detail: dict, scenario: str, n: int, drain: bool) -> dict:
        """n messages come due with no consumer: RSS, a SIGKILL and the
        restart, then (`drain`) the consumers take them all."""
        a = self.args
        prefix = scenario.replace("-", "_")
        lead_ms, window_ms = int(a.lag_lead_s * 1000), int(a.lag_window_s * 1000)
        spec = TriggerSpec(lead_ms, lead_ms + window_ms, seed=180)
        start_ms, sends = run_phase(f"{scenario} {system.name} send", self._producer_jobs(
            system, n, a.lag_send_batch, spec, False), a.phase_limit_s)
        self._check_sends(system, scenario, sends)
        sent = sum(r["sent"] for r in sends)
        seconds = max(r["ended"] for r in sends) - min(r["started"] for r in sends)
        detail["send"] = {"msgs": sent, "msgs_per_s": rounded(sent / seconds) if seconds else None,
                          **latency_summary(sends)}
        time.sleep(max(0.0, (start_ms + lead_ms + window_ms) / 1000 + a.settle_s - time.time()))
        def all_ready() -> bool:
            counts = system.counts()
            return counts.ready == sent and counts.total == sent

        try:
            wait_until(all_ready, a.phase_limit_s, f"{system.name}: all {sent:,} ready", every_s=0.2)
        except RuntimeError as e:
            self.problem(system.name, scenario, str(e), counts=system.counts().__dict__)
        counts = system.counts()
        detail["counts_due"] = counts.__dict__
        system.settle()
        memory_due = system.memory()
        detail["memory_due"] = memory_due
        figures = {f"{prefix}_msgs": n, f"{prefix}_rss_mb": memory_due["server_rss_mb"]}
        if "mover_rss_mb" in memory_due:
            figures[f"{prefix}_mover_rss_mb"] = memory_due["mover_rss_mb"]
        if system.restartable:
            log(f"{scenario} {system.name}: SIGKILL with {counts.total:,} held, restart")
            restart = system.kill_and_restart(counts.total, a.restart_limit_s)
            detail["restart"] = restart
            if not restart["recovered_ok"]:
                self.problem(system.name, scenario, "the restart did not bring back every message", **restart)
            time.sleep(0.2)
            detail["memory_after_restart"] = system.memory()
            figures.update({f"{prefix}_restart_s": restart["restart_s"],
                            f"{prefix}_rss_after_restart_mb": detail["memory_after_restart"]["server_rss_mb"]})
        else:
            detail["restart"] = "skipped: nothing on disk to restart from"
        if not drain:
            detail["drain"] = "skipped (--ten-million-drain runs it)"
            return figures
        meter: list[CpuMeter] = []
        drain_start, results = run_phase(
            f"{scenario} {system.name} drain", self._consumer_jobs(system, sent, a.lag_pull_batch, a.lag_ack, 0,
                                                            a.phase_limit_s),
            a.phase_limit_s + 30, on_open=lambda: meter.append(CpuMeter(system.pids(), system.parts())))
        cpu = meter[0].used()
        got = receipts(results, n)
        timed_out = now_ms() - drain_start >= a.phase_limit_s * 1000
        for e in got["errors"]:
            self.problem(system.name, scenario, "error answer to a consumer", **e)
        if got["lost"] and timed_out:
            self.problem(system.name, scenario, f"the drain had {got['distinct']:,} of {n:,} after --phase-limit-s "
                         f"{a.phase_limit_s}: incomplete (drain_msgs_per_s is the partial rate)")
        for what in ("duplicates", "unknown") if timed_out else ("lost", "duplicates", "unknown"):
            if got[what]:
                self.problem(system.name, scenario, f"{got[what]} {what} in the drain",
                             examples=got["lost_examples"] if what == "lost" else None)
        done_ms = max(x for x in (got["last_ack_ms"], got["last_receive_ms"]) if x is not None) if got["received"] else None
        drain_s = (done_ms - drain_start) / 1000 if done_ms else None
        requests = got["pulls"] + got["ack_requests"]
        cpu_figs, cpu_detail = cpu_figures(f"{prefix}_drain", cpu, got["distinct"], requests)
        detail.update({"drain": {**{k: v for k, v in got.items() if k not in ("lost_examples", "errors")},
                                 "pull_batch": a.lag_pull_batch, "ack": a.lag_ack, "seconds": rounded(drain_s, 3),
                                 "complete": got["distinct"] == n, **cpu_detail,
                                 "client_cpu_s": round(sum(r["client_cpu_s"] for r in results), 2)},
                       "memory_drained": system.memory(), "counts_drained": system.counts().__dict__})
        figures.update({f"{prefix}_drain_msgs_per_s": rounded(got["distinct"] / drain_s) if drain_s else None,
                        **cpu_figs, f"{prefix}_lost": got["lost"], f"{prefix}_duplicates": got["duplicates"]})
        return figures

    def roundtrip(self, system: System, detail: dict) -> dict:
        a = self.args
        meter: list[CpuMeter] = []
        _, (result,) = run_phase(f"roundtrip {system.name}", [(roundtrip, {
            "config": system.client_config(), "payload_bytes": a.payload_bytes, "iters": a.roundtrip_iters,
            "warmup": a.roundtrip_warmup})], a.phase_limit_s, on_open=lambda: meter.append(CpuMeter(system.pids(), system.parts())))
        cpu = meter[0].used()
        for e in result["errors"]:
            self.problem(system.name, "roundtrip", "error answer", **e)
        if result["lost"]:
            self.problem(system.name, "roundtrip", f"{result['lost']} trips whose poll did not get the message")
        trips, sends = sorted(result["trips_ms"]), sorted(result["sends_ms"])
        # A trip is one message sent, received and acked: server CPU a trip, over every trip (warm-up too).
        cpu_figs, cpu_detail = cpu_figures("roundtrip", cpu, result["trips_made"], None)
        detail.update({"trips": len(trips), "lost": result["lost"], "roundtrip_ms_max": percentile(trips, 1.0),
                       "send_ms_p50": percentile(sends, 0.5), "send_ms_p99": percentile(sends, 0.99),
                       "trips_made": result["trips_made"], **cpu_detail, "client_cpu_s": result["client_cpu_s"]})
        return {"roundtrip_ms_p50": percentile(trips, 0.5), "roundtrip_ms_p99": percentile(trips, 0.99), **cpu_figs}


# --- the report --------------------------------------------------------------------------

# Counts, not measures: a ratio of them means nothing.
NOT_RATIOS = ("_early", "_lost", "_duplicates", "_msgs")
# Every column of the report, durable peers first; a run shows those it has.
COLUMNS = ("hourglass", "hourglass_1", "redis_always", "redis_always_lua", "beanstalkd_f0", "redis", "redis_lua", "beanstalkd")
# The report's rows by scenario, in the order they run (a figure's prefix; the longer of two that match).
ROW_GROUPS = ("ingest_batch", "ingest_single", "dispatch", "dispatch_keyed", "burst", "burst_batch_ack", "roundtrip",
              "lag", "lag_10m", "engine", "spark")


def row_group(figure: str) -> int:
    matches = [i for i, prefix in enumerate(ROW_GROUPS) if figure.startswith(prefix + "_")]
    return max(matches, key=lambda i: len(ROW_GROUPS[i]), default=len(ROW_GROUPS))


def higher_is_better(figure: str) -> bool:
    """A rate (`_per_s`) is better larger; a time, a size or CPU smaller."""
    return figure.endswith("_per_s")


def peers_in_order(figures: dict[str, dict]) -> list[str]:
    """The peers of this run: durable ones first, then the defaults."""
    known = [c for c in COLUMNS if c in figures and c != "hourglass"]
    return known + sorted(set(figures) - set(COLUMNS))


def ratios(figures: dict[str, dict]) -> dict[str, dict]:
    """hourglass's figure / each peer's, for figures both have as numbers."""
    ours = figures.get("hourglass", {})
    out = {}
    for peer in peers_in_order(figures):
        theirs = figures[peer]
        out[f"hourglass_over_{peer}"] = {
            k: round(v / theirs[k], 3) for k, v in ours.items()
            if not k.endswith(NOT_RATIOS) and isinstance(v, (int, float)) and isinstance(theirs.get(k), (int, float))
            and theirs[k]}
    return out


def better(figures: dict[str, dict]) -> dict[str, dict]:
    """For each peer and each figure both have: "hourglass", the peer's
    name, or "same" (equal figures)."""
    ours = figures.get("hourglass", {})
    out = {}
    for peer in peers_in_order(figures):
        theirs = figures[peer]
        row = {}
        for k, v in ours.items():
            other = theirs.get(k)
            if k.endswith(NOT_RATIOS) or not isinstance(v, (int, float)) or not isinstance(other, (int, float)):
                continue
            if v == other:
                row[k] = "same"
            else:
                row[k] = "hourglass" if (v > other) == higher_is_better(k) else peer
        out[peer] = row
    return out


def targets(figures: dict[str, dict], args: argparse.Namespace) -> list[dict]:
    """Issue 28's targets against this run (its "Targets", and the
    per-request limits of its deliverable 2): each with its limit or the
    peer's figure it is held to, and met true/false, or null when a figure
    is missing (a scenario or system left out, or it failed)."""
    hg = figures.get("hourglass", {})
    out = []

    def check(what: str, figure: str, op: str, limit=None, against: str | None = None,
              against_figure: str | None = None, source: str = "Targets", note: str | None = None) -> None:
        value = hg.get(figure)
        if against is not None:
            limit = figures.get(against, {}).get(against_figure or figure)
        met = None
        if isinstance(value, (int, float)) and isinstance(limit, (int, float)):
            met = value >= limit if op == ">=" else value <= limit if op == "<=" else value == limit
        row = {"issue": 28, "source": source, "target": what, "figure": figure, "value": value, "op": op,
               "limit": limit, "met": met}
        if against:
            row["limit_from"] = against if against_figure is None else f"{against}.{against_figure}"
        if note:
            row["note"] = note
        out.append(row)

    check("batched ingest >= Redis always", "ingest_batch_msgs_per_s", ">=", against="redis_always")
    check("batched ingest: server CPU a message", "ingest_batch_server_cpu_us_per_msg", "<=", 10)
    check("single sends >= Redis always", "ingest_single_msgs_per_s", ">=", against="redis_always")
    check("single sends: server CPU a send", "ingest_single_server_cpu_us_per_msg", "<=", 70)
    nominal = args.dispatch_msgs / args.dispatch_window_s
    rate = None if nominal == 2000 else f"this run's dispatch is {nominal:,.0f} due a second, not 2,000"
    check("dispatch: lateness p99 <= Redis always's", "dispatch_lateness_ms_p99", "<=", against="redis_always",
          note=rate)
    check("dispatch: 0 early", "dispatch_early", "==", 0)
    check("dispatch: 0 lost", "dispatch_lost", "==", 0)
    check("burst, an ack per message: delivered/s >= Redis always's", "burst_delivered_per_s", ">=",
          against="redis_always")
    check("burst, an ack per message: lateness p99 <= 1,000 ms", "burst_lateness_ms_p99", "<=", 1000)
    check("round trip p50 <= Redis always's", "roundtrip_ms_p50", "<=", against="redis_always")
    notes = [note for note, applies in (
        ("this run's drain acks a pull at once", args.lag_ack != "single"),
        (f"this run's beanstalkd is -f {args.beanstalkd_fsync_ms}, not its default", args.beanstalkd_fsync_ms is not None))
        if applies]
    check("drain of the lag, an ack per message: msgs/s >= beanstalkd's default", "lag_drain_msgs_per_s", ">=",
          against="beanstalkd", note="; ".join(notes) or None)
    check("drain of the lag: server CPU a message", "lag_drain_server_cpu_us_per_msg", "<=", 25)
    check(f"keyed dispatch ({args.dispatch_keys} keys): lateness p99 <= Redis always's dispatch",
          "dispatch_keyed_lateness_ms_p99", "<=", against="redis_always", against_figure="dispatch_lateness_ms_p99")
    check("keyed dispatch: 0 early", "dispatch_keyed_early", "==", 0)
    check("keyed dispatch: 0 lost", "dispatch_keyed_lost", "==", 0)
    size = f"{args.lag_msgs:,} ready" + ("" if args.lag_msgs == 1_000_000 else " (the target is at 1,000,000)")
    check(f"lag: server RSS with {size}", "lag_rss_mb", "<=", 150)
    check(f"lag: restart with {size}", "lag_restart_s", "<=", 2)
    size = f"{args.ten_million_msgs:,} ready" + ("" if args.ten_million_msgs == 10_000_000 else
                                                 " (the target is at 10,000,000)")
    check(f"ten-million lag: server RSS with {size}", "lag_10m_rss_mb", "<=", 200)
    check(f"ten-million lag: restart with {size}", "lag_10m_restart_s", "<=", 3)
    check("engine append (bench/engine.py)", "engine_append_msgs_per_s", ">=", 150_000)
    check("Spark into a node (bench/spark_ingest.py)", "spark_rows_per_s", ">=", 50_000)
    for scenario in ("dispatch", "lag_drain"):
        check(f"a pull or an ack <= 50 us of server CPU ({scenario}: the mean over its pulls and acks)",
              f"{scenario}_server_cpu_us_per_request", "<=", 50, source="Deliver 2")
    check("batch pulls and batch acks <= 10 us of server CPU a message (burst, a pull's messages acked at once)",
          "burst_batch_ack_server_cpu_us_per_msg", "<=", 10, source="Deliver 3")
    return out


def summary(figures: dict[str, dict], the_better: dict[str, dict], the_targets: list[dict]) -> str:
    """The report as text: every figure of every system in one table, with
    hourglass / each durable and default peer and who is better ("+":
    hourglass, "-": the peer); then each target."""
    columns = [c for c in COLUMNS if c in figures] + sorted(set(figures) - set(COLUMNS))
    peers = [p for p in ("redis_always", "beanstalkd_f0", "redis", "beanstalkd") if p in figures
             and "hourglass" in figures]
    names: list[str] = []
    for c in columns:
        names += [k for k in figures[c] if k not in names]
    names.sort(key=row_group)

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
        return "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)

    rows = [["figure", *columns, *(f"hg/{p}" for p in peers)]]
    for name in names:
        row = [name, *(cell(figures[c].get(name)) for c in columns)]
        for p in peers:
            ours, theirs, who = figures["hourglass"].get(name), figures[p].get(name), the_better[p].get(name)
            if who is None or not theirs:
                row.append("")
            else:
                row.append(f"{ours / theirs:.3g} {'+' if who == 'hourglass' else '-' if who == p else '='}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    lines += ["", "hg/<peer>: hourglass's figure / the peer's; + hourglass's is better, - the peer's, = the same", "",
              "issue 28's targets:"]
    for t in the_targets:
        met = {True: "met    ", False: "NOT MET", None: "no data"}[t["met"]]
        limit = t.get("limit_from", "") and f" ({t['limit_from']})"
        lines.append(f"  {met}  {t['target']}: {cell(t['value'])} {t['op']} {cell(t['limit'])}{limit}")
    return "\n".join(lines)


def jsonable(value):
    if isinstance(value, array):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- command line -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test); flags given still win")
    p.add_argument("--report", metavar="JSON",
                   help="alone: print the table of the JSON an earlier run printed, and run nothing")
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                   help=f"comma list of {', '.join(SCENARIOS)} (default: all but lag-10m)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)} (default: all)")
    p.add_argument("--work-dir", default=None, help="where data dirs go (a fresh temp dir inside it, default /tmp)")
    p.add_argument("--keep", action="store_true", help="keep data dirs and server logs")
    p.add_argument("--hourglass-args", default="", type=shlex.split, help="extra flags for hourglass serve")
    p.add_argument("--hourglass-python", default=None,
                   help="run the hourglass installed for this interpreter (e.g. .venv/bin/python after the README's "
                        "set-up: the compiled build where it could be made), from outside the source tree; "
                        "default: this source tree's broker, pure Python")
    p.add_argument("--redis-server", default=shutil.which("redis-server"), help="default: the one on PATH")
    p.add_argument("--redis-send", choices=("pipeline", "lua"), default="pipeline",
                   help="how Redis producers send outside ingest-batch (which runs both)")
    p.add_argument("--tick-ms", type=float, default=5.0, help="the Redis mover's period")
    p.add_argument("--move-limit", type=int, default=1000, help="ids the mover moves per script call")
    p.add_argument("--beanstalkd", default=shutil.which("beanstalkd"), help="default: the one on PATH")
    p.add_argument("--beanstalkd-fsync-ms", type=int, default=None,
                   help="-f of the system `beanstalkd` (default: none, beanstalkd's own 50 ms; beanstalkd_f0 "
                        "is always -f 0)")
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=100, help="messages per send call (ingest-batch, dispatch)")
    p.add_argument("--ingest-batch-msgs", type=int, default=200_000)
    p.add_argument("--ingest-single-msgs", type=int, default=20_000)
    p.add_argument("--ingest-min-delay-s", type=int, default=60)
    p.add_argument("--ingest-max-delay-s", type=int, default=3600)
    p.add_argument("--dispatch-msgs", type=int, default=20_000)
    p.add_argument("--dispatch-window-s", type=float, default=10.0)
    p.add_argument("--lead-s", type=float, default=3.0, help="from the start to the first trigger (sends go first)")
    p.add_argument("--pull-batch", type=int, default=10, help="messages per long poll (dispatch, burst)")
    p.add_argument("--keys", type=int, default=0,
                   help="hourglass only: give messages serial keys k0..k{N-1} in every scenario (sendMsg's key: "
                        "one of a key consumed at a time); 0: none")
    p.add_argument("--dispatch-keys", type=int, default=100, help="serial keys of dispatch-keyed")
    p.add_argument("--poll-timeout-ms", type=int, default=1000, help="long-poll timeout")
    p.add_argument("--max-unacked", type=int, default=100, help="per consumer, received and not yet acked")
    p.add_argument("--ack-connections", type=int, default=2, help="per consumer, beside the polling one")
    p.add_argument("--ack-timeout-ms", type=int, default=300_000, help="longer than any run: no redelivery")
    p.add_argument("--grace-s", type=float, default=10.0,
                   help="past the last trigger, this long with nothing received ends a dispatch: the rest is lost")
    p.add_argument("--burst-msgs", type=int, default=20_000)
    p.add_argument("--burst-window-s", type=float, default=1.0)
    p.add_argument("--lag-msgs", type=int, default=1_000_000)
    p.add_argument("--ten-million", action="store_true", help="run lag-10m too (after the scenarios chosen)")
    p.add_argument("--ten-million-msgs", type=int, default=10_000_000, help="the messages of lag-10m")
    p.add_argument("--ten-million-systems", default="hourglass",
                   help="comma list of the systems lag-10m runs on (of those of --systems)")
    p.add_argument("--ten-million-drain", action="store_true",
                   help="lag-10m drains its messages too (long: they are not a target)")
    p.add_argument("--lag-send-batch", type=int, default=1000)
    p.add_argument("--lag-lead-s", type=float, default=2.0)
    p.add_argument("--lag-window-s", type=float, default=10.0)
    p.add_argument("--lag-pull-batch", type=int, default=100)
    p.add_argument("--lag-ack", choices=("single", "batch"), default="single", help="drain acks (batch: msgIds)")
    p.add_argument("--settle-s", type=float, default=2.0, help="after the last trigger, before counting ready")
    p.add_argument("--restart-limit-s", type=float, default=300.0)
    p.add_argument("--phase-limit-s", type=float, default=1800.0,
                   help="limit of each send, wait or drain phase (--ten-million: 7200 unless given)")
    p.add_argument("--roundtrip-iters", type=int, default=2000)
    p.add_argument("--roundtrip-warmup", type=int, default=50)
    p.add_argument("--engine-msgs", type=int, default=1_000_000, help="bench/engine.py --messages")
    p.add_argument("--spark-rows", type=int, default=500_000, help="bench/spark_ingest.py --rows")
    p.add_argument("--spark-warmup-rows", type=int, default=2_000, help="bench/spark_ingest.py --warmup-rows")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    if first.quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.systems = [s for s in args.systems.split(",") if s]
    args.ten_million_systems = [s for s in args.ten_million_systems.split(",") if s]
    unknown = sorted(set(args.scenarios) - set(SCENARIOS)) + sorted(
        set(args.systems + args.ten_million_systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown scenario or system {', '.join(unknown)}")
    if args.ten_million and "lag-10m" not in args.scenarios:
        args.scenarios.append("lag-10m")
    if "lag-10m" in args.scenarios and args.phase_limit_s == parser.get_default("phase_limit_s"):
        args.phase_limit_s = 7200.0
    if {"redis", "redis_always"} & set(args.systems) and not args.redis_server:
        parser.error("no redis-server on PATH (apt-get install -y redis-server): give --redis-server or leave "
                     "redis and redis_always out of --systems")
    if {"beanstalkd", "beanstalkd_f0"} & set(args.systems) and not args.beanstalkd:
        parser.error("no beanstalkd on PATH (apt-get install -y beanstalkd): give --beanstalkd or leave "
                     "beanstalkd and beanstalkd_f0 out of --systems")
    if min(args.producers, args.consumers, args.batch_size, args.pull_batch, args.lag_pull_batch,
           args.dispatch_keys) < 1:
        parser.error("--producers, --consumers, --batch-size, the pull batches and --dispatch-keys must be at "
                     "least 1")
    if args.payload_bytes < 40:
        parser.error("--payload-bytes must be at least 40 (the payload names the message and its trigger)")
    return args


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--report"] and len(argv) == 2:
        # The table again, from the JSON of an earlier run.
        with open(argv[1]) as f:
            saved = json.load(f)
        print(summary(saved["figures"], saved["better"], saved["targets"]))
        return 0
    args = parse_args(argv)
    unwind_on_signals()
    work_dir = tempfile.mkdtemp(prefix="hourglass-peers-", dir=args.work_dir)
    log(f"data and server logs in {work_dir}")
    machine = machine_info()
    bench = Bench(args, work_dir)
    try:
        bench.run()
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    machine["calibration_ms_after"] = calibration_ms()
    the_better, the_targets = better(bench.figures), targets(bench.figures, args)
    out = {
        "benchmark": "bench/peers.py",
        "quick": args.quick,
        "figures": {name: bench.figures[name] for name in COLUMNS if name in bench.figures},
        "durable_peers": [p for p in DURABLE_PEERS if p in bench.figures],
        "default_peers": [p for p in DEFAULT_PEERS if p in bench.figures],
        "ratios": ratios(bench.figures),
        "ratio_meaning": "hourglass's figure / the peer's: above 1, hourglass's is larger (better for a rate, "
                         "worse for a time, a size or CPU)",
        "better": the_better,
        "better_meaning": "for each figure, whose is better: a rate the larger, a time, a size or CPU the smaller",
        "targets": the_targets,
        "systems": bench.described,
        "scenarios": bench.details,
        "problems": bench.problems,
        "machine": machine,
        "source": source_state(),
        "parameters": {k: v for k, v in vars(args).items()},
        "total_wall_s": round(time.monotonic() - http_load._started, 2),
    }
    print(json.dumps(out, indent=1, default=jsonable), flush=True)
    print(summary(bench.figures, the_better, the_targets), file=sys.stderr, flush=True)
    return 1 if bench.failed or bench.problems else 0


if __name__ == "__main__":
    sys.exit(main())
