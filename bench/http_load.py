"""HTTP benchmark: real `hourglass serve` processes driven over the camellia
API on loopback. Prints one JSON object on stdout, progress on stderr.

    .venv/bin/python bench/http_load.py                   # every scenario but the 10M backlog
    .venv/bin/python bench/http_load.py --scale 0.05      # every count x0.05: a quick check
    .venv/bin/python bench/http_load.py --only dispatch,roundtrip
    .venv/bin/python bench/http_load.py --skip backlog --producer-procs
    .venv/bin/python bench/http_load.py --only backlog --ten-million   # adds 10,000,000 pending (long)

Each scenario starts its own server (`python -m broker.cli serve --fsync
batch --backend disk`, free port, fresh data directory under --work-dir,
default a new temp dir removed afterwards unless --keep) and stops it by
PID: SIGTERM, SIGKILL after 15 s. Messages carry --payload-bytes (100) of
`msg`. bench/compare.py runs these scenarios (class Bench, given another
backend) on the disk and the Redis backend side by side.

  ingest-batch   sendMsgBatch, --batch-size (500) messages a request,
                 --producers (4) concurrent producers, --batch-msgs
                 (200,000) in all, delays uniform in 1 min..1 day
                 -> ingest_batch_msgs_per_s
  ingest-single  sendMsg, one message a request, --producers concurrent,
                 --single-msgs (20,000) -> ingest_single_msgs_per_s
  dispatch       --dispatch-msgs (20,000) sent with absolute triggerTime =
                 start + --dispatch-lead-s (3) + uniform 0..--dispatch-window-s
                 (10); --consumers (4) long-poll (--poll-batch 100) and ack
                 each message, one ack at a time from a task beside the
                 poll loop (--no-ack: none, to see lateness without ack
                 load; the ack timeout outlasts the run). Receive wall
                 time (time.time(), same machine as the server) minus
                 triggerTime of each first receipt
                 -> lateness_ms_p50 / p99 / max; early = receipts before
                 triggerTime; lost = ids never received within
                 --grace-s (10) after the last trigger; duplicates = ids
                 received more than once
  roundtrip      sequential sendMsg (delayMillis=0) then longPollingMsg,
                 --roundtrip-iters (500) after --roundtrip-warmup (50)
                 -> roundtrip_ms_p50 / p99 (send start to poll answer)
  backlog        --backlog-msgs (1,000,000) pending over --backlog-days (30)
                 via sendMsgBatch -> rss_mb_1m (server VmRSS); then SIGKILL
                 and restart on the same data dir -> restart_s_1m, seconds
                 from spawning the process until /health answers 200 and
                 getTopicInfo's waitingQueueSize is the full count again.
                 --ten-million repeats it with 10,000,000 (rss_mb_10m).

Client side: aiohttp, one ClientSession per producer and consumer, kept
alive across its requests. The machine has 2 cores, so the client competes
with the server for CPU; to keep that cost out of the ingest figures the
request bodies of ingest-batch and ingest-single are encoded before the
clock starts, and ingest answers are checked by HTTP status only (status
equals `code`, docs/api.md) and by getTopicInfo's count afterwards. By default
the producers are coroutines of this process (one extra busy process);
with --producer-procs each producer is a forked process of its own (more
client parallelism, more contention). Every scenario reports the client's
and the server's CPU seconds, so a reader can tell which side was the limit.
The backlog bodies are encoded while sending (1M pre-encoded bodies would
be ~150 MB), which costs client CPU but does not touch the figures it gives.

Anything the server got wrong (an early, lost or duplicate message, an
error answer, a non-zero exit) is listed under "problems" with the request
and the answer; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator

import aiohttp
from harness import ROOT, CpuMeter, Server, disk_bytes, memory_mb, own_cpu_s, percentile

from broker.http.paths import PREFIX

SECOND_MS = 1000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS
JSON_TYPE = "application/json"
FORM_TYPE = "application/x-www-form-urlencoded"
SCENARIOS = ("ingest-batch", "ingest-single", "dispatch", "roundtrip", "backlog")
# How many examples of one kind of problem the report quotes.
EVIDENCE = 5

_started = time.monotonic()

Bodies = Iterable[tuple[bytes, int]]  # (request body, messages in it)


def log(text: str) -> None:
    print(f"[{time.monotonic() - _started:8.1f} s] {text}", file=sys.stderr, flush=True)


def count_label(count: int) -> str:
    """1_000_000 -> "1m", 50_000 -> "50k": the suffix of backlog figures."""
    for unit, suffix in ((1_000_000, "m"), (1_000, "k")):
        if count >= unit and count % unit == 0:
            return f"{count // unit}{suffix}"
    return str(count)


def calibration_ms() -> float:
    """Milliseconds for a fixed pure-Python workload (JSON encoding and
    decoding): how fast this shared machine runs Python at the moment, to
    compare runs whose figures differ."""
    item = {"msg": "x" * 100, "msgId": "calibrate-123456", "delayMillis": 86_400_000}
    started = time.perf_counter()
    for _ in range(200):
        json.loads(json.dumps({"topic": "calibrate", "msgs": [item] * 500}))
    return round((time.perf_counter() - started) * 1000, 1)


def source_state() -> dict:
    """The commit the server runs from and the files changed on top of it."""
    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", "-C", ROOT, *argv], capture_output=True, text=True, timeout=10).stdout
        except OSError:
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD").strip() or None,
            "changed": [line[3:] for line in git("status", "--porcelain").splitlines()]}


# --- request bodies ---------------------------------------------------------


def payload(msg_id: str, size_bytes: int) -> str:
    return msg_id.ljust(size_bytes, "x")[:size_bytes]


def spread_messages(prefix: str, count: int, payload_bytes: int, min_delay_ms: int, max_delay_ms: int,
                    seed: int) -> Iterator[dict]:
    rng = random.Random(seed)
    for i in range(count):
        msg_id = f"{prefix}{i}"
        yield {"msg": payload(msg_id, payload_bytes), "msgId": msg_id,
               "delayMillis": rng.randint(min_delay_ms, max_delay_ms)}


def batch_bodies(topic: str, messages: Iterable[dict], batch_size: int) -> Iterator[tuple[bytes, int]]:
    batch: list[dict] = []
    for message in messages:
        batch.append(message)
        if len(batch) == batch_size:
            yield json.dumps({"topic": topic, "msgs": batch}).encode(), len(batch)
            batch = []
    if batch:
        yield json.dumps({"topic": topic, "msgs": batch}).encode(), len(batch)


def form_bodies(topic: str, messages: Iterable[dict]) -> Iterator[tuple[bytes, int]]:
    for message in messages:
        yield urllib.parse.urlencode({"topic": topic, **message}).encode(), 1


def shares(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal counts."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --- producers ---------------------------------------------------------------


def client_session(connections: int = 1) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def produce(url: str, content_type: str, bodies: Bodies, counter) -> dict:
    """POST each body in turn on one keep-alive connection. Stops after
    EVIDENCE error answers (the figures would mean nothing)."""
    latencies_ms: list[float] = []
    answered_ms: list[float] = []  # wall time of each answer, for dispatch
    errors: list[dict] = []
    msgs = 0
    headers = {"Content-Type": content_type}
    async with client_session() as session:
        started = time.monotonic()
        for body, count in bodies:
            sent = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as answer:
                text = await answer.read()
            latencies_ms.append((time.perf_counter() - sent) * 1000)
            answered_ms.append(time.time() * 1000)
            if answer.status != 200:
                errors.append({"request": f"POST {url} {body[:200]!r}", "status": answer.status,
                               "answer": text[:500].decode("utf-8", "replace")})
                if len(errors) >= EVIDENCE:
                    break
                continue
            msgs += count
            with counter.get_lock():
                counter.value += count
        ended = time.monotonic()
    return {"msgs": msgs, "started": started, "ended": ended, "latencies_ms": latencies_ms,
            "answered_ms": answered_ms, "errors": errors}


def _producer_child(url: str, content_type: str, make_bodies: Callable[[], Bodies], pre_encode: bool,
                    barrier, counter, results) -> None:
    bodies = list(make_bodies()) if pre_encode else make_bodies()
    barrier.wait()
    cpu_before = own_cpu_s()
    result = asyncio.run(produce(url, content_type, bodies, counter))
    result["client_cpu_s"] = own_cpu_s() - cpu_before
    results.put(result)


class Progress:
    """Prints a running count to stderr every `every_s` from a thread, so it
    works whether the producers are coroutines here or other processes."""

    def __init__(self, label: str, total: int, counter, every_s: float = 10.0) -> None:
        self.label, self.total, self.counter, self.every_s = label, total, counter, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            log(f"{self.label}: {self.counter.value:,} / {self.total:,}")

    def __enter__(self) -> Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run_producers(server: Server, path: str, content_type: str, producers: list[Callable[[], Bodies]], *,
                  total: int, in_processes: bool, pre_encode: bool, label: str, pids: dict[str, int]) -> dict:
    """Run one producer per callable (each makes its bodies) against
    `server`, in this process or one forked process each; returns the
    throughput from the first start to the last answer, request latency
    percentiles, and the CPU seconds of the client and of the serving
    processes `pids` (see CpuMeter) over that span."""
    url = server.base + PREFIX + path
    fork = multiprocessing.get_context("fork")
    counter = fork.Value("q", 0)
    if in_processes:
        barrier = fork.Barrier(len(producers) + 1)
        results_queue = fork.Queue()
        children = [fork.Process(target=_producer_child, daemon=True,
                                 args=(url, content_type, make, pre_encode, barrier, counter, results_queue))
                    for make in producers]
        for child in children:
            child.start()
        try:
            barrier.wait(timeout=600)  # every child has encoded its bodies
            meter = CpuMeter(pids)
            with Progress(label, total, counter):
                results = []
                while len(results) < len(children):
                    try:
                        results.append(results_queue.get(timeout=1))
                    except queue.Empty:
                        if any(c.exitcode not in (None, 0) for c in children):
                            raise RuntimeError(f"a producer process died: {[c.exitcode for c in children]}") from None
            server_cpu = meter.used()
        finally:
            for child in children:
                child.join(timeout=10)
                if child.is_alive():
                    child.kill()
        client_cpu = sum(r["client_cpu_s"] for r in results)
    else:
        bodies = [list(make()) if pre_encode else make() for make in producers]

        async def all_producers() -> list[dict]:
            return await asyncio.gather(*(produce(url, content_type, b, counter) for b in bodies))

        meter, cpu_before = CpuMeter(pids), own_cpu_s()
        with Progress(label, total, counter):
            results = asyncio.run(all_producers())
        server_cpu, client_cpu = meter.used(), own_cpu_s() - cpu_before
    msgs = sum(r["msgs"] for r in results)
    seconds = max(r["ended"] for r in results) - min(r["started"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies_ms"])
    return {"msgs": msgs, "seconds": round(seconds, 3), "msgs_per_s": round(msgs / seconds, 1) if seconds else None,
            "requests": len(latencies), "request_ms_p50": percentile(latencies, 0.5),
            "request_ms_p99": percentile(latencies, 0.99), "client_cpu_s": round(client_cpu, 2),
            **server_cpu, "errors": [e for r in results for e in r["errors"]][:EVIDENCE],
            "answered_ms": [r["answered_ms"] for r in results]}


# --- the bench: servers, problems, scenarios ---------------------------------


def waiting_count(server: Server, topic: str) -> tuple[int | None, object]:
    """waitingQueueSize from getTopicInfo (None if not answered 200)."""
    status, answer = server.get("getTopicInfo", topic=topic)
    if status != 200 or not isinstance(answer, dict):
        return None, answer
    return answer["data"]["waitingQueueSize"], answer


class DiskBackend:
    """Where the scenarios' `hourglass serve` keeps its state. This one is
    the default, `--backend disk`: each scenario's fresh data directory is
    all there is. bench/compare.py adds a Redis backend; a backend names the
    processes of its own whose CPU and memory belong with the server's."""

    name = "disk"
    restart_scope = ("hourglass serve killed (SIGKILL) and started again on the same data dir, which holds "
                     "the backlog: it replays its commit log and scans")

    def serve_flags(self) -> list[str]:
        return ["--backend", "disk"]

    @contextlib.contextmanager
    def state(self, scenario: str) -> Iterator[None]:
        """Fresh state for one scenario (the disk's is its data dir)."""
        yield

    def pids(self) -> dict[str, int]:
        return {}

    def memory(self) -> dict:
        """VmRSS of the backend's own processes ("rss_mb") and its details."""
        return {"rss_mb": 0.0}

    def disk_bytes(self) -> int:
        """Bytes the backend's own processes keep on disk."""
        return 0

    def restart_everything(self, bench: Bench, scenario: str, server: Server, count: int) -> tuple[Server, dict]:
        """Kill and restart whatever the backlog lives in besides hourglass
        serve, if that means anything (here it does not)."""
        return server, {}


class Bench:
    def __init__(self, args: argparse.Namespace, work_dir: str, backend: DiskBackend | None = None) -> None:
        self.args = args
        self.work_dir = work_dir
        self.backend = backend or DiskBackend()
        self.problems: list[dict] = []

    def problem(self, scenario: str, what: str, **evidence) -> None:
        log(f"PROBLEM in {scenario}: {what}")
        self.problems.append({"scenario": scenario, "what": what, **evidence})

    def data_dir(self, name: str) -> str:
        return os.path.join(self.work_dir, name)

    def start_server(self, name: str, wait_s: float = 60) -> Server:
        data_dir = self.data_dir(name)
        return Server.start(data_dir, "--fsync", "batch", *self.backend.serve_flags(), log_path=data_dir + ".log",
                            wait_s=wait_s)

    def pids(self, server: Server) -> dict[str, int]:
        """The serving processes, for CpuMeter."""
        return {"server": server.proc.pid, **self.backend.pids()}

    def stop_server(self, scenario: str, server: Server) -> None:
        code = server.stop()
        if code is None:
            self.problem(scenario, "serve did not exit within 15 s of SIGTERM (killed)", log=server.log_path)
        elif code != 0 and code != -9:  # -9: this bench killed it
            self.problem(scenario, f"serve exited {code} after SIGTERM", log=server.log_path)

    @contextlib.contextmanager
    def server(self, name: str) -> Iterator[Server]:
        with self.backend.state(name):
            server = self.start_server(name)
            try:
                yield server
            finally:
                self.stop_server(name, server)

    def check_ingest(self, scenario: str, server: Server, topic: str, result: dict) -> bool:
        """Whether every send was answered 200 and all of them wait."""
        for error in result["errors"]:
            self.problem(scenario, "error answer to a send", **error)
        waiting, answer = waiting_count(server, topic)
        result["waiting_after"] = waiting
        if waiting != result["msgs"]:
            self.problem(scenario, f"{result['msgs']} sends answered 200 but waitingQueueSize is {waiting}",
                         request=f"GET getTopicInfo?topic={topic}", answer=answer)
        return not result["errors"] and waiting == result["msgs"]

    # --- scenarios ---

    def send_spread(self, server: Server, topic: str, count: int, *, batched: bool, min_delay_ms: int,
                    max_delay_ms: int, pre_encode: bool) -> dict:
        """Send `count` messages to `topic` from --producers producers, delays
        uniform in [min_delay_ms, max_delay_ms], by sendMsgBatch or sendMsg."""
        a = self.args

        def producer(index: int, share: int) -> Callable[[], Bodies]:
            def bodies() -> Bodies:
                messages = spread_messages(f"p{index}-", share, a.payload_bytes, min_delay_ms, max_delay_ms,
                                           seed=index)
                return batch_bodies(topic, messages, a.batch_size) if batched else form_bodies(topic, messages)
            return bodies

        per_request = f"{a.batch_size} a request" if batched else "one a request"
        log(f"{topic}: sending {count:,} msgs, {per_request}, {a.producers} producers")
        result = run_producers(server, "sendMsgBatch" if batched else "sendMsg", JSON_TYPE if batched else FORM_TYPE,
                               [producer(i, n) for i, n in enumerate(shares(count, a.producers))], total=count,
                               in_processes=a.producer_procs, pre_encode=pre_encode, label=topic,
                               pids=self.pids(server))
        del result["answered_ms"]
        result["stored"] = self.check_ingest(topic, server, topic, result)
        return result

    def ingest_batch(self) -> tuple[dict, dict]:
        with self.server("ingest-batch") as server:
            result = self.send_spread(server, "ingest-batch", self.args.batch_msgs, batched=True,
                                      min_delay_ms=60 * SECOND_MS, max_delay_ms=DAY_MS, pre_encode=True)
        return {"ingest_batch_msgs_per_s": result["msgs_per_s"]}, result

    def ingest_single(self) -> tuple[dict, dict]:
        with self.server("ingest-single") as server:
            result = self.send_spread(server, "ingest-single", self.args.single_msgs, batched=False,
                                      min_delay_ms=60 * SECOND_MS, max_delay_ms=DAY_MS, pre_encode=True)
        return {"ingest_single_msgs_per_s": result["msgs_per_s"]}, result

    def dispatch(self) -> tuple[dict, dict]:
        with self.server("dispatch") as server:
            return asyncio.run(Dispatch(self, server).run())

    def roundtrip(self) -> tuple[dict, dict]:
        with self.server("roundtrip") as server:
            return asyncio.run(self._roundtrip(server))

    async def _roundtrip(self, server: Server) -> tuple[dict, dict]:
        a = self.args
        topic = "roundtrip"
        send_url, poll_url, ack_url = (server.base + PREFIX + p for p in ("sendMsg", "longPollingMsg", "ackMsg"))
        poll_body = urllib.parse.urlencode({"topic": topic, "batch": 1, "ackTimeoutMillis": 60_000,
                                            "longPollingTimeoutMillis": 5000}).encode()
        headers = {"Content-Type": FORM_TYPE}
        roundtrips_ms: list[float] = []
        sends_ms: list[float] = []
        misses = 0
        log(f"roundtrip: {a.roundtrip_warmup} warm-up + {a.roundtrip_iters} sequential send -> long poll")
        meter = CpuMeter(self.pids(server))
        async with client_session(2) as session:
            for i in range(a.roundtrip_warmup + a.roundtrip_iters):
                msg_id = f"rt-{i}"
                send_body = urllib.parse.urlencode({"topic": topic, "msg": payload(msg_id, a.payload_bytes),
                                                    "msgId": msg_id, "delayMillis": 0}).encode()
                started = time.perf_counter()
                async with session.post(send_url, data=send_body, headers=headers) as answer:
                    send_text = await answer.read()
                sent = time.perf_counter()
                if answer.status != 200:
                    self.problem("roundtrip", "error answer to sendMsg", request=send_body.decode(),
                                 status=answer.status, answer=send_text.decode("utf-8", "replace")[:500])
                    break
                async with session.post(poll_url, data=poll_body, headers=headers) as answer:
                    poll_text = await answer.read()
                received = time.perf_counter()
                got = json.loads(poll_text).get("delayMsgList", []) if answer.status == 200 else []
                if [m["msgId"] for m in got] != [msg_id]:
                    misses += 1
                    if misses <= EVIDENCE:
                        self.problem("roundtrip", f"long poll after sending {msg_id} (delay 0) did not return it",
                                     request=f"POST longPollingMsg {poll_body.decode()}", status=answer.status,
                                     answer=poll_text.decode("utf-8", "replace")[:500])
                for m in got:
                    async with session.post(ack_url, data={"topic": topic, "msgId": m["msgId"]}) as answer:
                        await answer.read()
                if i >= a.roundtrip_warmup:
                    roundtrips_ms.append((received - started) * 1000)
                    sends_ms.append((sent - started) * 1000)
        roundtrips_ms.sort()
        sends_ms.sort()
        detail = {"iterations": len(roundtrips_ms), "misses": misses,
                  "roundtrip_ms_max": percentile(roundtrips_ms, 1.0),
                  "send_ms_p50": percentile(sends_ms, 0.5), "send_ms_p99": percentile(sends_ms, 0.99),
                  **meter.used()}
        return {"roundtrip_ms_p50": percentile(roundtrips_ms, 0.5),
                "roundtrip_ms_p99": percentile(roundtrips_ms, 0.99)}, detail

    def backlog(self, count: int) -> tuple[dict, dict]:
        a = self.args
        label = count_label(count)
        name = f"backlog-{label}"
        with self.backend.state(name):
            server = self.start_server(name)
            try:
                # Encoded while sending: a million pre-encoded bodies would be ~150 MB.
                result = self.send_spread(server, name, count, batched=True, min_delay_ms=HOUR_MS,
                                          max_delay_ms=a.backlog_days * DAY_MS, pre_encode=False)
                if not result["stored"]:
                    raise RuntimeError(f"{name}: the backlog was not stored as sent (see problems)")
                time.sleep(a.settle_s)  # let a checkpoint or two run, as a server at rest would
                memory = memory_mb(server.proc.pid)
                backend_memory = self.backend.memory()
                rss = memory["rss_mb"]
                result.update({"memory": memory, "rss_total_mb": round(rss + backend_memory["rss_mb"], 1),
                               "disk_bytes_per_msg": round((disk_bytes(self.data_dir(name))
                                                            + self.backend.disk_bytes()) / max(1, count), 1)})
                backend = ""
                if self.backend.pids():
                    result["backend_memory"] = backend_memory
                    backend = f", {self.backend.name} {backend_memory}"
                log(f"{name}: RSS {rss} MB ({memory}{backend}); SIGKILL and restart")
                server.kill()
                server, restart = self.respawn(name, result["msgs"], time.monotonic())
                result.update({"restart_health_s": restart["health_s"], "restart_scope": self.backend.restart_scope,
                               "memory_after_restart": memory_mb(server.proc.pid)})
                server, everything = self.backend.restart_everything(self, name, server, result["msgs"])
                result.update(everything)
            finally:
                self.stop_server(name, server)
        return {f"rss_mb_{label}": rss, f"restart_s_{label}": restart["restart_s"]}, result

    def respawn(self, name: str, count: int, spawned: float) -> tuple[Server, dict]:
        """Start `name`'s server again and wait until getTopicInfo counts all
        `count` messages waiting: seconds from `spawned` until /health
        answered (health_s) and until the count was whole (restart_s; None if
        not within --restart-timeout-s, a problem)."""
        a = self.args
        server = self.start_server(name, wait_s=a.restart_timeout_s)
        health_s = time.monotonic() - spawned
        deadline = spawned + a.restart_timeout_s
        waiting, answer = waiting_count(server, name)
        while waiting != count and time.monotonic() < deadline:
            time.sleep(0.02)
            waiting, answer = waiting_count(server, name)
        restart_s: float | None = round(time.monotonic() - spawned, 3)
        if waiting != count:
            self.problem(name, f"after restart waitingQueueSize is {waiting}, not {count}, "
                         f"{a.restart_timeout_s} s after spawning", request=f"GET getTopicInfo?topic={name}",
                         answer=answer)
            restart_s = None
        return server, {"health_s": round(health_s, 3), "restart_s": restart_s}


class Dispatch:
    """The dispatch scenario's state: what was sent with which trigger time,
    and every receipt the consumers recorded."""

    TOPIC = "dispatch"

    def __init__(self, bench: Bench, server: Server) -> None:
        self.bench = bench
        self.args = bench.args
        self.server = server
        self.trigger_ms: dict[str, int] = {}
        # (msgId, triggerTime as delivered, wall ms at receipt, retry)
        self.receipts: list[tuple[str, int, float, int]] = []
        self.first_seen: set[str] = set()  # ids sent by this run, received at least once
        self.lost: list[str] = []
        self.all_received = asyncio.Event()
        self.stop = asyncio.Event()
        self.errors: list[dict] = []
        self.acks_ms: list[float] = []  # latency of each ackMsg
        self.last_ack_ms = 0.0  # wall time the last ack was answered

    def _on_receipt(self, message: dict, received_ms: float) -> None:
        msg_id = message["msgId"]
        self.receipts.append((msg_id, message.get("triggerTime"), received_ms, message.get("retry")))
        if msg_id in self.trigger_ms:
            self.first_seen.add(msg_id)
            if len(self.first_seen) == len(self.trigger_ms):
                self.all_received.set()

    async def _consume(self) -> None:
        a = self.args
        base = self.server.base + PREFIX
        poll_body = urllib.parse.urlencode({"topic": self.TOPIC, "batch": a.poll_batch,
                                            "ackTimeoutMillis": a.ack_timeout_ms,
                                            "longPollingTimeoutMillis": 1000}).encode()
        headers = {"Content-Type": FORM_TYPE}
        acks: asyncio.Queue[str | None] = asyncio.Queue()
        # Acks go out from their own task so that the poll loop re-polls at once,
        # as a consumer handing messages to workers would.
        async with client_session(2) as session:

            async def ack_loop() -> None:
                while (msg_id := await acks.get()) is not None:
                    body = urllib.parse.urlencode({"topic": self.TOPIC, "msgId": msg_id}).encode()
                    sent = time.perf_counter()
                    async with session.post(base + "ackMsg", data=body, headers=headers) as answer:
                        text = await answer.read()
                    self.acks_ms.append((time.perf_counter() - sent) * 1000)
                    self.last_ack_ms = time.time() * 1000
                    if answer.status != 200 and len(self.errors) < EVIDENCE:
                        self.errors.append({"request": f"POST ackMsg {body.decode()}", "status": answer.status,
                                            "answer": text.decode("utf-8", "replace")[:500]})

            acker = asyncio.create_task(ack_loop())
            while not self.stop.is_set():
                async with session.post(base + "longPollingMsg", data=poll_body, headers=headers) as answer:
                    text = await answer.read()
                received_ms = time.time() * 1000
                if answer.status != 200:
                    if len(self.errors) < EVIDENCE:
                        self.errors.append({"request": f"POST longPollingMsg {poll_body.decode()}",
                                            "status": answer.status, "answer": text.decode("utf-8", "replace")[:500]})
                    await asyncio.sleep(0.1)
                    continue
                for message in json.loads(text)["delayMsgList"]:
                    self._on_receipt(message, received_ms)
                    if not a.no_ack:
                        acks.put_nowait(message["msgId"])
            acks.put_nowait(None)
            await acker

    async def run(self) -> tuple[dict, dict]:
        a = self.args
        rng = random.Random(7)
        start_ms = int(time.time() * 1000)
        lead_ms, window_ms = int(a.dispatch_lead_s * 1000), int(a.dispatch_window_s * 1000)
        for i in range(a.dispatch_msgs):
            self.trigger_ms[f"d-{i}"] = start_ms + lead_ms + rng.randint(0, window_ms)
        messages = [{"msg": payload(msg_id, a.payload_bytes), "msgId": msg_id, "triggerTime": trigger}
                    for msg_id, trigger in self.trigger_ms.items()]
        per_producer = [messages[i::a.producers] for i in range(a.producers)]
        bodies = [list(batch_bodies(self.TOPIC, part, a.batch_size)) for part in per_producer]
        log(f"dispatch: {a.dispatch_msgs:,} msgs due {a.dispatch_lead_s}..{a.dispatch_lead_s + a.dispatch_window_s} s "
            f"from now, {a.consumers} consumers long-polling batch {a.poll_batch}")
        meter, cpu_before = CpuMeter(self.bench.pids(self.server)), own_cpu_s()
        consumers = [asyncio.create_task(self._consume()) for _ in range(a.consumers)]
        counter = multiprocessing.Value("q", 0)
        url = self.server.base + PREFIX + "sendMsgBatch"
        sends = await asyncio.gather(*(produce(url, JSON_TYPE, b, counter) for b in bodies))
        send_s = time.time() - start_ms / 1000
        # A message whose send was answered after its trigger time cannot be on time.
        sent_after_trigger = 0
        for part, result in zip(per_producer, sends):
            for i, answered in enumerate(result["answered_ms"]):
                batch = part[i * a.batch_size:(i + 1) * a.batch_size]
                sent_after_trigger += sum(1 for m in batch if m["triggerTime"] < answered)
            for error in result["errors"]:
                self.bench.problem("dispatch", "error answer to sendMsgBatch", **error)
        log(f"dispatch: sent in {send_s:.2f} s ({sent_after_trigger} answered after their trigger time)")
        last_trigger_ms = max(self.trigger_ms.values())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_received.wait(),
                                   timeout=max(0.0, (last_trigger_ms / 1000 + a.grace_s) - time.time()))
        self.stop.set()
        await asyncio.gather(*consumers)
        server_cpu, client_cpu = meter.used(), own_cpu_s() - cpu_before
        headline, detail = self._report()
        self.acks_ms.sort()
        if self.acks_ms:
            # Acks queue up behind the poll loop; how far behind the last one ends.
            detail.update({"acks": len(self.acks_ms), "ack_ms_p50": percentile(self.acks_ms, 0.5),
                           "ack_ms_p99": percentile(self.acks_ms, 0.99),
                           "last_ack_after_last_trigger_s": round((self.last_ack_ms - last_trigger_ms) / 1000, 3)})
        detail.update({"send_s": round(send_s, 3), "sent_after_trigger": sent_after_trigger,
                       "client_cpu_s": round(client_cpu, 2), **server_cpu})
        await self._lost_evidence()
        return headline, detail

    def _report(self) -> tuple[dict, dict]:
        lateness_ms: list[float] = []
        seen: dict[str, list[tuple]] = {}
        early = unknown = mismatched = 0
        for receipt in self.receipts:
            msg_id, delivered_trigger_ms, received_ms, retry = receipt
            seen.setdefault(msg_id, []).append(receipt)
            trigger_ms = self.trigger_ms.get(msg_id)
            if trigger_ms is None:
                unknown += 1
                continue
            if delivered_trigger_ms != trigger_ms:
                mismatched += 1
                if mismatched <= EVIDENCE:
                    self.bench.problem("dispatch", f"{msg_id} sent with triggerTime {trigger_ms} came back with "
                                       f"{delivered_trigger_ms}")
            if received_ms < trigger_ms:
                early += 1
                if early <= EVIDENCE:
                    self.bench.problem("dispatch", f"{msg_id} received {trigger_ms - received_ms:.1f} ms before "
                                       f"its triggerTime", trigger_ms=trigger_ms, received_ms=received_ms, retry=retry)
            if len(seen[msg_id]) == 1:
                lateness_ms.append(received_ms - trigger_ms)
        duplicated = {k: v for k, v in seen.items() if len(v) > 1}
        for msg_id, receipts in list(duplicated.items())[:EVIDENCE]:
            self.bench.problem("dispatch", f"{msg_id} received {len(receipts)} times",
                               receipts=[{"triggerTime": t, "received_ms": r, "retry": n} for _, t, r, n in receipts])
        for error in self.errors:
            self.bench.problem("dispatch", "error answer to a consumer", **error)
        self.lost = sorted(self.trigger_ms.keys() - seen.keys())
        lateness_ms.sort()
        headline = {"lateness_ms_p50": percentile(lateness_ms, 0.5), "lateness_ms_p99": percentile(lateness_ms, 0.99),
                    "lateness_ms_max": percentile(lateness_ms, 1.0), "early": early, "lost": len(self.lost),
                    "duplicates": len(duplicated)}
        detail = {"sent": len(self.trigger_ms), "received": len(self.receipts), "unknown_ids": unknown,
                  "trigger_mismatches": mismatched}
        return headline, detail

    async def _lost_evidence(self) -> None:
        """Ask the server what became of a few lost messages."""
        if not self.lost:
            return
        answers = []
        async with client_session() as session:
            for msg_id in self.lost[:EVIDENCE]:
                async with session.post(self.server.base + PREFIX + "getMsg",
                                        data={"topic": self.TOPIC, "msgId": msg_id}) as answer:
                    answers.append({"request": f"POST getMsg topic={self.TOPIC}&msgId={msg_id}",
                                    "status": answer.status, "answer": (await answer.text())[:500],
                                    "sent_triggerTime": self.trigger_ms[msg_id]})
        _, info = waiting_count(self.server, self.TOPIC)
        self.bench.problem("dispatch", f"{len(self.lost)} of {len(self.trigger_ms)} sent messages never received "
                           f"within {self.args.grace_s} s after the last trigger", examples=answers,
                           topic_info=info)


# --- command line --------------------------------------------------------------


def build_parser(description: str | None = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SCENARIOS), help=f"comma list of scenarios ({', '.join(SCENARIOS)})")
    p.add_argument("--skip", default="", help="comma list of scenarios to leave out")
    p.add_argument("--ten-million", action="store_true", help="also the 10,000,000-message backlog (long)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every message count and iteration count")
    p.add_argument("--work-dir", default=None, help="where data dirs go (a fresh temp dir inside it)")
    p.add_argument("--keep", action="store_true", help="keep the data dirs and server logs")
    p.add_argument("--producer-procs", action="store_true", help="one forked process per producer")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--payload-bytes", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=500, help="messages per sendMsgBatch")
    p.add_argument("--batch-msgs", type=int, default=200_000)
    p.add_argument("--single-msgs", type=int, default=20_000)
    p.add_argument("--dispatch-msgs", type=int, default=20_000)
    p.add_argument("--dispatch-lead-s", type=float, default=3.0)
    p.add_argument("--dispatch-window-s", type=float, default=10.0)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--poll-batch", type=int, default=100)
    p.add_argument("--ack-timeout-ms", type=int, default=60_000, help="longer than the run: no redelivery")
    p.add_argument("--no-ack", action="store_true", help="dispatch consumers do not ack (lateness without ack load)")
    p.add_argument("--grace-s", type=float, default=10.0, help="wait after the last trigger before calling a msg lost")
    p.add_argument("--roundtrip-iters", type=int, default=500)
    p.add_argument("--roundtrip-warmup", type=int, default=50)
    p.add_argument("--backlog-msgs", type=int, default=1_000_000)
    p.add_argument("--backlog-days", type=int, default=30)
    p.add_argument("--settle-s", type=float, default=3.0, help="pause after the backlog is sent, before RSS")
    p.add_argument("--restart-timeout-s", type=float, default=600.0)
    return p


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    chosen = [s for s in args.only.split(",") if s]
    skipped = [s for s in args.skip.split(",") if s]
    unknown = sorted(set(chosen + skipped) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    args.scenarios = [s for s in SCENARIOS if s in chosen and s not in skipped]
    for name in ("batch_msgs", "single_msgs", "dispatch_msgs", "roundtrip_iters", "roundtrip_warmup", "backlog_msgs"):
        setattr(args, name, max(1, round(getattr(args, name) * args.scale)))
    if args.producers < 1 or args.consumers < 1 or args.batch_size < 1 or args.payload_bytes < 1:
        parser.error("--producers, --consumers, --batch-size and --payload-bytes must be at least 1")
    return args


def make_work_dir(args: argparse.Namespace) -> str:
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="hourglass-bench-", dir=args.work_dir)
    log(f"data and server logs in {work_dir}")
    return work_dir


def machine_info() -> dict:
    """The machine, with a calibration_ms_before (add calibration_ms_after at the end)."""
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "calibration_ms_before": calibration_ms()}


Run = Callable[[], tuple[dict, dict]]


def scenario_runs(bench: Bench) -> list[tuple[str, Run]]:
    """(name, run) of each scenario chosen by bench.args, in order."""
    args = bench.args
    runs: list[tuple[str, Run]] = [
        (name, getattr(bench, name.replace("-", "_"))) for name in args.scenarios if name != "backlog"]
    if "backlog" in args.scenarios:
        runs.append((f"backlog-{count_label(args.backlog_msgs)}", lambda: bench.backlog(args.backlog_msgs)))
    if args.ten_million:
        runs.append(("backlog-10m", lambda: bench.backlog(10_000_000)))
    return runs


def run_scenario(name: str, run: Run) -> tuple[dict, dict, bool]:
    """(headline, detail, whether it ran through) of one scenario; its
    failure is logged and reported, not raised: one broken scenario should
    not hide the others' figures."""
    started = time.monotonic()
    ok = True
    try:
        headline, detail = run()
    except Exception as e:
        ok = False
        log(f"{name} failed: {e!r}")
        headline, detail = {}, {"error": repr(e)}
    detail["wall_s"] = round(time.monotonic() - started, 2)
    log(f"{name}: {json.dumps(headline)} ({detail['wall_s']} s)")
    return headline, detail, ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work_dir = make_work_dir(args)
    bench = Bench(args, work_dir)
    machine = machine_info()
    out: dict = {"machine": machine, "source": source_state(),
                 "parameters": {k: v for k, v in vars(args).items()}}
    details: dict = {}
    failed = False
    try:
        for name, run in scenario_runs(bench):
            headline, details[name], ok = run_scenario(name, run)
            failed = failed or not ok
            out.update(headline)
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    machine["calibration_ms_after"] = calibration_ms()
    out["scenarios"] = details
    out["problems"] = bench.problems
    out["total_wall_s"] = round(time.monotonic() - _started, 2)
    print(json.dumps(out, indent=1))
    return 1 if failed or bench.problems else 0


if __name__ == "__main__":
    sys.exit(main())
