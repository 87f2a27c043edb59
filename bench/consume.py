"""Where a consumed message's CPU goes: the broker in-process, and one
request over loopback, apart. Prints ONE JSON object.

    .venv/bin/python bench/consume.py               # --msgs 50000 --requests 5000
    .venv/bin/python bench/consume.py --requests-only --requests 20000

In-process (a real Store in a temporary directory, `Broker` driven on
uvloop without HTTP; CPU is this process's user+system time, fsync's
included):

  ack_us_per_msg        --msgs due now pulled 100 at a time, then acked one
                        by one by 4 concurrent tasks (as 4 consumers would)
  drain_us_per_msg      --msgs due now with the window (4096) long spilled:
  drain_msgs_per_s      pull 100, answer them as JSON, ack them in one
                        ack_many, until none are left

Over loopback (a `hourglass serve` child, one client connection sending one
request at a time; CPU is the server's own, from /proc/<pid>/stat):

  request_us_health     GET /health
  request_us_empty_pull POST pullMsg of a topic with nothing ready
  request_us_get_unknown POST getMsg of an id that is not there
  front_us_<request>    the same requests' bytes fed to one kept-alive
                        Connection in process (parser, head decisions,
                        router, API, broker; no socket, so none of the
                        system calls and wake-ups that vary with the load)
  handler_us_health, handler_us_empty_pull   the same requests handed to
                        the server's handler in-process, with no socket
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import tempfile
import time

import orjson
import uvloop
from harness import Server, cpu_s, free_port

from broker.api import delay_msg
from broker.clock import SystemClock
from broker.config import ServeConfig
from broker.disk_broker import Broker
from broker.httpd import Request
from broker.metrics import Metrics
from broker.nodes import DiskNode
from broker.params import AckRequest, Defaults, NewSend, PullRequest
from storage.config import StoreConfig
from storage.store import NewMessage, Store

PAYLOAD = "x" * 100


async def _broker(directory: str) -> tuple[Broker, Store]:
    clock = SystemClock()
    store = Store.open(directory, StoreConfig(), now_ms=clock.now_ms())
    broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(directory, "tick"))
    broker.start()
    return broker, store


async def _fill(broker: Broker, n: int) -> None:
    now = broker.clock.now_ms()
    for first in range(0, n, 1000):
        await broker.send([NewSend(NewMessage("t", f"id{i}", PAYLOAD, now, now, 3_600_000, 10), False)
                           for i in range(first, min(n, first + 1000))])
    await asyncio.sleep(0.5)  # the wheel has seen them all


async def ack_path(n: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        broker, store = await _broker(directory)
        await _fill(broker, n)
        ids: list[str] = []
        while len(ids) < n:
            got = await broker.pull(PullRequest("t", 600_000, 100, ()))
            ids += [m.msg_id for m in got]

        async def acker(k: int) -> None:
            for msg_id in ids[k::4]:
                await broker.ack(AckRequest("t", msg_id, True))
        cpu = time.process_time()
        await asyncio.gather(*(acker(k) for k in range(4)))
        cpu = time.process_time() - cpu
        await broker.stop()
        store.close()
    return {"ack_us_per_msg": round(cpu / n * 1e6, 1)}


async def drain(n: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        broker, store = await _broker(directory)
        await _fill(broker, n)
        got = 0
        cpu, wall = time.process_time(), time.perf_counter()
        while got < n:
            msgs = await broker.pull(PullRequest("t", 600_000, 100, ()))
            if not msgs:
                await asyncio.sleep(0.001)
                continue
            orjson.dumps({"code": 200, "msg": "success", "delayMsgList": [delay_msg(m) for m in msgs]})
            await broker.ack_many("t", [m.msg_id for m in msgs])
            got += len(msgs)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await broker.stop()
        store.close()
    return {"drain_us_per_msg": round(cpu / n * 1e6, 1), "drain_msgs_per_s": round(n / wall)}


PULL_BODY = b"topic=nothing-here&batch=1"
GET_BODY = b"topic=nothing-here&msgId=no-such-id"
PULL_HEADERS = {"host": "127.0.0.1", "content-type": "application/x-www-form-urlencoded",
                "content-length": str(len(PULL_BODY))}


async def handler_costs(n: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        node = DiskNode(ServeConfig(data_dir=directory))
        node.broker.start()
        handle, _ = node.app()
        out = {}
        for name, make in (("health", lambda: Request("GET", "/health", b"", {"host": "127.0.0.1"}, b"", None)),
                           ("empty_pull", lambda: Request("POST", "/camellia/delayQueue/pullMsg", b"",
                                                          PULL_HEADERS, PULL_BODY, None))):
            cpu = time.process_time()
            for _ in range(n):
                await handle(make())
            out[f"handler_us_{name}"] = round((time.process_time() - cpu) / n * 1e6, 1)
        await node.broker.stop()
        node.store.close()
    return out


class _Transport:
    """What a Connection writes to, in process: each answer completes a
    future (the last byte of every answer here is the JSON's `}`)."""

    def __init__(self) -> None:
        self.answered: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if self.answered is not None and not self.answered.done() and data.endswith(b"}"):
            self.answered.set_result(None)

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def front_costs(n: int) -> dict:
    """The server's own CPU of a request from its bytes to its answer's
    bytes (parser, head decisions, router, API, broker), in process on one
    kept-alive Connection: no socket, so no system calls and no wake-ups,
    which on this machine's VM cost more than the request itself and vary
    with the load. A node whose app is `handler()`/`api.body_cap` (before
    the head decisions) is measured the same way."""
    import broker.httpd as httpd

    with tempfile.TemporaryDirectory() as directory:
        node = DiskNode(ServeConfig(data_dir=directory))
        node.broker.start()
        if hasattr(node, "app"):
            dispatch, admit = node.app()
            shared = httpd._Shared(dispatch, admit, httpd.Limits())
        else:
            shared = httpd._Shared(node.handler(), node.api.body_cap, httpd.Limits())
        connection = httpd.Connection(shared)
        transport = _Transport()
        connection.connection_made(transport)  # (a stand-in for the socket transport)
        loop = asyncio.get_running_loop()
        out = {}
        for name, raw in REQUESTS.items():
            for i in range(n + 2000):  # 2,000 to warm up
                if i == 2000:
                    cpu = time.process_time()
                transport.answered = loop.create_future()
                connection.data_received(raw)
                await transport.answered
            out[f"front_us_{name}"] = round((time.process_time() - cpu) / n * 1e6, 2)
        await node.broker.stop()
        node.store.close()
    return out


REQUESTS = {
    "health": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "empty_pull": b"POST /camellia/delayQueue/pullMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(PULL_BODY), PULL_BODY),
    "get_unknown": b"POST /camellia/delayQueue/getMsg HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(GET_BODY), GET_BODY)}


def request_costs(n: int) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        server = Server.start(os.path.join(directory, "data"), "--log-level", "WARNING", port=port,
                              log_path=os.path.join(directory, "serve.log"))
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            out = {}
            for name, raw in REQUESTS.items():
                for _ in range(200):  # warm up
                    _round_trip(conn, raw)
                cpu = cpu_s(server.proc.pid)
                for _ in range(n):
                    _round_trip(conn, raw)
                out[f"request_us_{name}"] = round((cpu_s(server.proc.pid) - cpu) / n * 1e6, 1)
            conn.close()
            return out
        finally:
            server.stop()


def _round_trip(conn: socket.socket, raw: bytes) -> None:
    conn.sendall(raw)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += conn.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += conn.recv(65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--msgs", type=int, default=50_000, help="messages of the in-process ack and drain runs")
    parser.add_argument("--requests", type=int, default=5_000, help="requests of each loopback measurement")
    parser.add_argument("--requests-only", action="store_true",
                        help="only the loopback measurement: one raw keep-alive client, one request at a time")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    figures: dict = {}
    if args.requests_only:
        figures.update(uvloop.run(front_costs(args.requests)))
        figures.update(request_costs(args.requests))
        print(json.dumps({"figures": figures, "parameters": vars(args)}, indent=1))
        return
    figures.update(uvloop.run(ack_path(min(args.msgs, 9_000))))  # (under --max-inflight's 10,000)
    figures.update(uvloop.run(drain(args.msgs)))
    figures.update(uvloop.run(handler_costs(args.requests * 4)))
    figures.update(uvloop.run(front_costs(args.requests)))
    figures.update(request_costs(args.requests))
    print(json.dumps({"figures": figures, "parameters": vars(args)}, indent=1))


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
