"""The flow path's server CPU, in process: a request's bytes fed to kept-alive
`Connection`s of a real node (a store in a temporary directory, `--fsync
batch`: every send and ack answered after its fsync) over stand-in
transports, several clients at once, each sending its next request when its
answer is written. CPU is this process's user+system time: the parser, the
head decisions, the API, the broker, the group commit and the fsyncs
themselves (no socket, no wake-up: bench/peers.py measures those over
loopback). Prints ONE JSON object.

    .venv/bin/python bench/flow.py                       # every scenario
    .venv/bin/python bench/flow.py --scenarios send --clients 1,4
    .venv/bin/python bench/flow.py --profile send        # cProfile of one scenario, to stderr

  send_us_per_request      sendMsg of one message (delay 1 min..1 h)
  batch_us_per_msg         sendMsgBatch of --batch (100) messages, per message
  pull_ack_us_per_request  pullMsg of one due message, then ackMsg of it:
                           the mean of the two requests
  drain_us_per_msg         pullMsg of 100 due messages, then one ackMsg
                           per message (as bench/peers.py's drain), per message
  drain_batch_us_per_msg   the same with one ackMsg of the 100 ids
  handoff_us_per_round     the CPU a commit round spends handing its fsync
                           to the syncer thread and back (broker.disk.syncer):
                           one task sending one message and awaiting the
                           group commit, less the same rounds made inline
                           (send, fsync, apply, on the loop); beside it
                           fsync_us_per_round, the fsync's own CPU (the
                           inline rounds less the same without the fsync)

Each figure is measured for each --clients count (clients at once; `_c4`
in the key for 4), with the number of fsyncs per request it took and the
requests answered a second (wall clock, clients included) beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import uvloop
from front_cpu import _Transport as _FrontTransport

import broker.http.httpd as httpd
from broker.node.config import ServeConfig
from broker.node.standalone import DiskNode
from storage.config import FsyncPolicy, StoreConfig

API = b"/camellia/delayQueue/"
PAYLOAD = b"x" * 100


class _Transport(_FrontTransport):
    """front_cpu's stand-in transport, keeping each whole answer (every
    answer here ends with its JSON's `}`) as the waiting future's result."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: asyncio.Future[bytes] | None = None  # type: ignore[assignment]
        self.buffer = b""

    def write(self, data: bytes) -> None:
        self.buffer += data
        if self.answered is not None and not self.answered.done() and data.endswith(b"}"):
            self.answered.set_result(self.buffer)
            self.buffer = b""


def _post(route: bytes, body: bytes, content_type: bytes = b"application/x-www-form-urlencoded") -> bytes:
    return (b"POST %s%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (API, route, content_type, len(body), body))


def _send(msg_id: str, delay_ms: int) -> bytes:
    return _post(b"sendMsg", b"topic=t&msg=%s&msgId=%s&delayMillis=%d" % (PAYLOAD, msg_id.encode(), delay_ms))


def _batch(first: int, count: int, delay_ms: Callable[[], int]) -> bytes:
    msgs = b",".join(b'{"msg":"%s","msgId":"b%d","delayMillis":%d}' % (PAYLOAD, first + i, delay_ms())
                     for i in range(count))
    return _post(b"sendMsgBatch", b'{"topic":"t","msgs":[%s]}' % msgs, b"application/json")


class Node:
    """A real disk node in a temporary directory, reached through
    in-process connections."""

    def __init__(self, directory: str, fsync: str) -> None:
        self.node = DiskNode(ServeConfig(data_dir=directory, store=StoreConfig(fsync=FsyncPolicy(fsync))))
        self.node.broker.start()
        self.shared = httpd._Shared(self.node.app().admit, httpd.Limits())
        self.loop = asyncio.get_running_loop()
        self.wall_s = 0.0

    def client(self) -> Client:
        return Client(self)

    def fsyncs(self) -> int:
        return int(self.node.metrics.fsync_seconds.count)

    async def close(self) -> None:
        await self.node.broker.stop()
        self.node.store.close()


class Client:
    def __init__(self, node: Node) -> None:
        self.loop = node.loop
        self.connection = httpd.Connection(node.shared)
        self.transport = _Transport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]

    async def request(self, raw: bytes) -> bytes:
        self.transport.answered = self.loop.create_future()
        self.loop.call_soon(self.connection.data_received, raw)  # from the loop, as a socket's bytes are
        answer = await self.transport.answered
        if b'"code":200' not in answer:
            raise RuntimeError(f"not answered 200: {answer[:300]!r}")
        return answer


def _ids(answer: bytes) -> list[bytes]:
    out, pos = [], 0
    while (pos := answer.find(b'"msgId":"', pos)) >= 0:
        end = answer.index(b'"', pos + 9)
        out.append(answer[pos + 9:end])
        pos = end
    return out


async def _measure(node: Node, clients: int, work: Callable[[Client, int], Iterator[bytes]],
                   units_per_client: int) -> tuple[float, int]:
    """Run `work` on `clients` clients at once; CPU seconds and fsyncs."""
    conns = [node.client() for _ in range(clients)]

    async def run(k: int) -> None:
        gen = work(conns[k], k)
        answer = None
        while True:
            try:
                raw = gen.send(answer) if answer is not None else next(gen)
            except StopIteration:
                return
            answer = await conns[k].request(raw)
    fsyncs, cpu, wall = node.fsyncs(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(run(k) for k in range(clients)))
    node.wall_s = time.perf_counter() - wall
    return time.process_time() - cpu, node.fsyncs() - fsyncs


async def _fill_due(node: Node, n: int) -> None:
    client = node.client()
    for first in range(0, n, 500):
        await client.request(_batch(10_000_000 + first, min(500, n - first), lambda: 0))
    await asyncio.sleep(0.3)


async def handoff(rounds: int) -> dict[str, float]:
    """CPU per commit round: through the syncer thread, inline, and inline
    without the fsync (see the module docstring)."""
    from broker.disk.group_commit import GroupCommit
    from broker.observe.metrics import Metrics
    from storage.store import NewMessage, Store
    now_ms = int(time.time() * 1000)
    cpu: dict[str, float] = {}
    for mode in ("inline", "syncer", "inline", "no_fsync", "syncer", "no_fsync"):
        with tempfile.TemporaryDirectory() as directory:
            store = Store.open(directory, StoreConfig(), now_ms=now_ms)
            commits = GroupCommit(store, lambda entries: None, Metrics())
            runner = asyncio.create_task(commits.run())
            started = time.process_time()
            for i in range(rounds):
                store.send([NewMessage("t", f"m{i}", "x" * 100, now_ms, now_ms + 600_000, 60_000, 1)], now_ms)
                if mode == "syncer":
                    await commits.durable()
                else:
                    if mode == "inline":
                        store.sync_log()
                    store.apply_pending()
                    await asyncio.sleep(0)  # (a turn of the loop, as the answer's)
            cpu[mode] = cpu.get(mode, 0.0) + (time.process_time() - started) / 2
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            store.close()
    return {"handoff_us_per_round": round((cpu["syncer"] - cpu["inline"]) / rounds * 1e6, 1),
            "fsync_us_per_round": round((cpu["inline"] - cpu["no_fsync"]) / rounds * 1e6, 1),
            "syncer_round_us": round(cpu["syncer"] / rounds * 1e6, 1),
            "inline_round_us": round(cpu["inline"] / rounds * 1e6, 1)}


async def scenario(name: str, clients: int, n: int, batch: int, fsync: str) -> dict[str, float]:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as directory:
        node = Node(directory, fsync)
        try:
            out: dict[str, float] = {}
            per = max(1, n // clients)
            if name == "send":
                def work(_c: Client, k: int) -> Iterator[bytes]:
                    for i in range(per):
                        yield _send(f"s{k}-{i}", rng.randrange(60_000, 3_600_000))
                cpu, fsyncs = await _measure(node, clients, work, per)
                requests = per * clients
                out[f"send_us_per_request_c{clients}"] = cpu / requests * 1e6
            elif name == "batch":
                def work(_c: Client, k: int) -> Iterator[bytes]:
                    for i in range(max(1, per // batch)):
                        yield _batch((k * per + i * batch), batch, lambda: rng.randrange(60_000, 3_600_000))
                cpu, fsyncs = await _measure(node, clients, work, per)
                requests = max(1, per // batch) * clients
                out[f"batch_us_per_msg_c{clients}"] = cpu / (requests * batch) * 1e6
            elif name == "pull_ack":
                await _fill_due(node, per * clients)

                def work(_c: Client, k: int) -> Iterator[bytes]:
                    for _ in range(per):
                        answer = yield _post(b"pullMsg", b"topic=t&batch=1&ackTimeoutMillis=600000")
                        for msg_id in _ids(answer):
                            yield _post(b"ackMsg", b"topic=t&msgId=" + msg_id)
                cpu, fsyncs = await _measure(node, clients, work, per)
                requests = per * clients * 2
                out[f"pull_ack_us_per_request_c{clients}"] = cpu / requests * 1e6
            elif name in ("drain", "drain_batch"):
                await _fill_due(node, per * clients)
                requests_made = [0]

                def work(_c: Client, k: int) -> Iterator[bytes]:
                    taken = 0
                    while taken < per:
                        answer = yield _post(b"pullMsg", b"topic=t&batch=100&ackTimeoutMillis=600000")
                        requests_made[0] += 1
                        ids = _ids(answer)
                        if not ids:
                            return
                        taken += len(ids)
                        if name == "drain":
                            for msg_id in ids:
                                requests_made[0] += 1
                                yield _post(b"ackMsg", b"topic=t&msgId=" + msg_id)
                        else:
                            requests_made[0] += 1
                            yield _post(b"ackMsg", b"topic=t&msgIds=" + b",".join(ids))
                cpu, fsyncs = await _measure(node, clients, work, per)
                requests = requests_made[0]
                out[f"{name}_us_per_msg_c{clients}"] = cpu / (per * clients) * 1e6
            else:
                raise SystemExit(f"unknown scenario {name}")
            out[f"{name}_fsyncs_per_request_c{clients}"] = fsyncs / requests
            out[f"{name}_requests_per_s_c{clients}"] = requests / node.wall_s
            return {k: round(v, 3 if "fsyncs" in k else 1) for k, v in out.items()}
        finally:
            await node.close()


SCENARIOS = ("send", "batch", "pull_ack", "drain", "drain_batch", "handoff")
SIZES = {"send": 20_000, "batch": 200_000, "pull_ack": 10_000, "drain": 50_000, "drain_batch": 100_000,
         "handoff": 5_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ", ".join(SCENARIOS))
    parser.add_argument("--clients", default="1,4", help="comma list of client counts")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply each scenario's size")
    parser.add_argument("--batch", type=int, default=100, help="messages a sendMsgBatch")
    parser.add_argument("--sort", default="tottime", help="the cProfile order: tottime, cumulative")
    parser.add_argument("--fsync", default="batch", choices=("batch", "never"), help="the node's --fsync")
    parser.add_argument("--profile", metavar="SCENARIO", help="cProfile this scenario (the last --clients count) to stderr")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        clients = int(args.clients.split(",")[-1])
        uvloop.run(scenario(args.profile, clients, int(SIZES[args.profile] * args.scale), args.batch, args.fsync))
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(args.sort).print_stats(60)
        return
    figures: dict[str, float] = {}
    for name in args.scenarios.split(","):
        if name == "handoff":  # one task: a client count means nothing here
            figures.update(uvloop.run(handoff(int(SIZES[name] * args.scale))))
            continue
        for clients in (int(c) for c in args.clients.split(",")):
            figures.update(uvloop.run(scenario(name, clients, int(SIZES[name] * args.scale), args.batch, args.fsync)))
            print(json.dumps(figures), file=sys.stderr)
    print(json.dumps({"benchmark": "bench/flow.py", "figures": figures, "parameters": vars(args)}, indent=1))


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
