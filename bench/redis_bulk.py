"""A big bulk call on the Redis backend, and who else Redis answers while it
runs (docs/redis.md, "Bulk calls in bounded steps"). Prints ONE JSON object.

    .venv/bin/python bench/redis_bulk.py                       # 100,000 messages; batches 100 and one script
    .venv/bin/python bench/redis_bulk.py --messages 20000 --batches 100
    .venv/bin/python bench/redis_bulk.py --batches 100 --key     # every message under one key, deleted by it

For each --redis-bulk-batch in --batches, on a fresh redis-server (free
loopback port, no persistence) and a fresh `hourglass serve --backend
redis://...`: one topic gets --messages waiting messages (triggers over
24 h, 100 tags, sendMsgBatch of 1,000; with --key, all under the one key
KEY), then ONE `deleteMsgs all=true limit=<messages>` (with --key,
`deleteMsgs key=KEY limit=<messages>`, read through the key index) runs
while

  - a separate process sends PING to redis-server on a connection of its
    own, one after another with 2 ms between (ping_max_ms, ping_p99_ms);
  - this process sends `sendMsg` to another topic of the node, one after
    another with 5 ms between (send_other_max_ms, send_other_p99_ms);
  - one `sendMsg` to the topic being deleted is made once the call is
    committed and being applied (the topic's `bulk` list exists):
    send_same_topic_ms, as it waits for the rest of the call.

Beside them: the call's wall time (delete_s) and answer, how many scripts
applied it (steps: LPOP calls in INFO commandstats, one a step) and the
longest script Redis ran over the call (script_max_ms, from SLOWLOG, every
command of 1 ms or more logged), and afterwards what is left live (must
be 0), DELETED (must be --messages) and delivered by a pull (must be 0).
A batch of 1000000 is the call in one script, as before the steps.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import redis
from harness import Process, Server, free_port, percentile, unwind_on_signals, wait_until

from broker.http.paths import PREFIX
from broker.redis.keys import TopicKeys

HOUR_MS = 3_600_000
TOPIC = "bulk"
TAGS = 100
BATCH = 1000
KEY = "account-42"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ping_probe(port: int, pipe: Connection) -> None:
    """PING redis-server until told to stop; send back each latency (ms)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe.send("ready")
        times = []
        while not pipe.poll():
            began = time.perf_counter()
            s.sendall(b"PING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += s.recv(64)
            times.append((time.perf_counter() - began) * 1000)
            time.sleep(0.002)
        pipe.send(times)


def admin(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def slowlog_max_ms(client: redis.Redis) -> float:
    """The longest command SLOWLOG holds, in ms."""
    return round(max((e["duration"] for e in client.slowlog_get(100_000)), default=0) / 1000, 2)


async def call(session: aiohttp.ClientSession, base: str, name: str, **params: Any) -> dict[str, Any]:
    if name == "sendMsgBatch":
        request = session.post(base + name, json=params)
    else:
        request = session.post(base + name, data={k: str(v) for k, v in params.items()})
    async with request as response:
        answer: dict[str, Any] = await response.json(content_type=None)
    if answer.get("code") != 200:
        raise RuntimeError(f"{name}: {answer}")
    return answer


async def timed(session: aiohttp.ClientSession, base: str, name: str, **params: Any) -> float:
    began = time.perf_counter()
    await call(session, base, name, **params)
    return (time.perf_counter() - began) * 1000


async def scenario(base: str, port: int, messages: int, by_key: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        start_ms = int(time.time() * 1000)
        began = time.perf_counter()
        for first in range(0, messages, BATCH):
            await call(session, base, "sendMsgBatch", topic=TOPIC, msgs=[
                {"msgId": f"m{i:08d}", "msg": "x" * 40, "tag": f"t{i % TAGS}", "ttlMillis": 48 * HOUR_MS,
                 "triggerTime": start_ms + HOUR_MS + int(i * 24 * HOUR_MS / messages), **({"key": KEY} if by_key else {})}
                for i in range(first, min(first + BATCH, messages))])
        out["load_s"] = round(time.perf_counter() - began, 1)
        log(f"  loaded {messages} in {out['load_s']} s")
        await call(session, base, "sendMsg", topic="other", msg="s", msgId="warm", delayMillis=HOUR_MS)
        client = admin(port)
        client.config_set("slowlog-log-slower-than", 1000)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        client.config_resetstat()

        here, there = multiprocessing.Pipe()
        prober = multiprocessing.Process(target=ping_probe, args=(port, there), daemon=True)
        prober.start()
        assert here.recv() == "ready"
        began = time.perf_counter()
        matching: dict[str, str] = {"key": KEY} if by_key else {"all": "true"}
        delete = asyncio.create_task(call(session, base, "deleteMsgs", topic=TOPIC, limit=messages, **matching))

        async def same_topic() -> float | None:
            while not await asyncio.to_thread(client.exists, TopicKeys.of("hg", TOPIC).bulk):  # (Redis may be busy)
                if delete.done():
                    return None
                await asyncio.sleep(0.005)
            return await timed(session, base, "sendMsg", topic=TOPIC, msg="s", msgId="same", delayMillis=HOUR_MS)
        same = asyncio.create_task(same_topic())
        sends, n = [], 0
        while not delete.done():
            sends.append(await timed(session, base, "sendMsg", topic="other", msg="s", msgId=f"s{n}",
                                     delayMillis=HOUR_MS))
            n += 1
            await asyncio.sleep(0.005)
        answer = await delete
        out["delete_s"] = round(time.perf_counter() - began, 3)
        here.send("stop")
        pings = sorted(here.recv())
        prober.join(10)
        out["deleted"], out["more"] = answer["deleted"], answer["more"]
        out["steps"] = int(client.info("commandstats").get("cmdstat_lpop", {}).get("calls", 0))
        out["script_max_ms"] = slowlog_max_ms(client)
        client.close()
        out["ping_count"] = len(pings)
        out["ping_max_ms"] = round(pings[-1], 2) if pings else None
        out["ping_p99_ms"] = round(percentile(pings, 0.99) or 0, 2)
        sends.sort()
        out["send_other_count"] = len(sends)
        out["send_other_max_ms"] = round(sends[-1], 2) if sends else None
        out["send_other_p99_ms"] = round(percentile(sends, 0.99) or 0, 2)
        same_ms = await same
        out["send_same_topic_ms"] = None if same_ms is None else round(same_ms, 1)
        count = await call(session, base, "listMsg", topic=TOPIC, countOnly="true")
        out["left_live"] = count["count"] - (same_ms is not None)  # the same-topic send, made after the call
        out["deleted_status_7"] = (await call(session, base, "listMsg", topic=TOPIC, status="7",
                                              countOnly="true"))["count"]
        out["delivered_after"] = len((await call(session, base, "pullMsg", topic=TOPIC, batch=1000))["delayMsgList"])
    return out


def run_batch(batch: int, messages: int, by_key: bool) -> dict[str, Any]:
    work_dir = tempfile.mkdtemp(prefix="hourglass-redis-bulk-")
    port = free_port()
    redis_server = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", work_dir], os.path.join(work_dir, "redis.log"))
    server = None
    try:
        with admin(port) as client:
            wait_until(client.ping, 10, "redis-server", redis_server, every_s=0.02)
        server = Server.start(os.path.join(work_dir, "data"), "--backend", f"redis://127.0.0.1:{port}/0",
                              "--redis-bulk-batch", str(batch), log_path=os.path.join(work_dir, "serve.log"))
        log(f"--redis-bulk-batch {batch}")
        return asyncio.run(scenario(server.base + PREFIX, port, messages, by_key))
    finally:
        if server is not None:
            server.stop()
        redis_server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batches", default="100,1000000", help="--redis-bulk-batch values, one run each")
    parser.add_argument("--key", action="store_true", help=f"every message under the key {KEY!r}, deleted by it")
    args = parser.parse_args()
    if args.messages < BATCH or args.messages % BATCH:
        parser.error(f"--messages must be a multiple of {BATCH}")
    unwind_on_signals()
    result: dict[str, Any] = {"messages": args.messages, "tags": TAGS, "by_key": args.key}
    for batch in (int(b) for b in args.batches.split(",")):
        result[f"batch_{batch}"] = run_batch(batch, args.messages, args.key)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
