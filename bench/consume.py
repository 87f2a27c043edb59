"""Where a consumed message's CPU goes: the broker in-process, and one
request over loopback, apart. Prints ONE JSON object.

    .venv/bin/python bench/consume.py               # --msgs 50000 --requests 5000
    .venv/bin/python bench/front_cpu.py             # a request's own CPU, in process and over loopback

In-process (a real Store in a temporary directory, `Broker` driven on
uvloop without HTTP; CPU is this process's user+system time, fsync's
included):

  ack_us_per_msg        --msgs due now pulled 100 at a time, then acked one
                        by one by 4 concurrent tasks (as 4 consumers would)
  drain_us_per_msg      --msgs due now with the window (4096) long spilled:
  drain_msgs_per_s      pull 100, answer them as JSON, ack them in one
                        ack_many, until none are left

A request's own CPU (bench/front_cpu.py, whose figures this prints too):

  front_us_<request>    GET /health, POST pullMsg of a topic with nothing
                        ready, POST getMsg of an unknown id: their bytes
                        fed to one kept-alive Connection in process
  loopback_us_<request> the same over loopback: a `hourglass serve` child,
                        one raw keep-alive client, one request at a time;
                        the server's own CPU from /proc/<pid>/stat
  handler_us_health, handler_us_empty_pull   the same requests handed to
                        the server's handler in-process, with no socket
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import tempfile
import time

import orjson
import uvloop
from front_cpu import front_costs, loopback_costs

from broker.clock import SystemClock
from broker.core.delay_msg import delay_msg
from broker.core.params import AckRequest, Defaults, NewSend, PullRequest
from broker.disk.backend import Broker
from broker.http.http_types import Request, Response
from broker.node.config import ServeConfig
from broker.node.standalone import DiskNode
from broker.observe.metrics import Metrics
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
PULL_HEADERS = {"host": "127.0.0.1", "content-type": "application/x-www-form-urlencoded",
                "content-length": str(len(PULL_BODY))}


async def handler_costs(n: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        node = DiskNode(ServeConfig(data_dir=directory))
        node.broker.start()
        gate = node.app()

        async def handle(request: Request) -> object:  # the command the gate finds on the head, called
            command = gate.admit(request)
            if isinstance(command, Response):
                raise RuntimeError(f"refused: {command.body!r}")
            return await command.handler(request)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--msgs", type=int, default=50_000, help="messages of the in-process ack and drain runs")
    parser.add_argument("--requests", type=int, default=5_000, help="requests of each loopback measurement")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    figures: dict = {}
    figures.update(uvloop.run(ack_path(min(args.msgs, 9_000))))  # (under --max-inflight's 10,000)
    figures.update(uvloop.run(drain(args.msgs)))
    figures.update(uvloop.run(handler_costs(args.requests * 4)))
    figures.update(uvloop.run(front_costs(args.requests)))
    figures.update(loopback_costs(args.requests))
    print(json.dumps({"figures": figures, "parameters": vars(args)}, indent=1))


if __name__ == "__main__":
    from storage.files import raise_descriptor_limit

    raise_descriptor_limit()  # as `hourglass serve` does, before any store opens
    main()
