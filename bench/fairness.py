"""Fairness between tenants (docs/api.md, "Fairness between tenants"):
tenant A's --messages (1,000,000) come due at once on one topic; then
tenant B sends one message due now every second while 4 consumers pull
10 and ack each message (one ackMsg per message); B's release lateness --
the client's clock when the pull holding B's message answered, minus its
triggerTime -- p50, p99 and max, while A drains. Twice, each on a fresh
node: with the topic's fairness `fairKey` (setTopicConfig) and without, for
contrast. Prints ONE JSON object.

    .venv/bin/python bench/fairness.py                       # 1,000,000 of A's
    .venv/bin/python bench/fairness.py --messages 100000 --seconds 30

A run ends when A's backlog is drained or after --seconds (default 120)
of B's sends; a B message not handed out by then counts with its lateness
at the end (`b_unreleased` says how many). `a_per_s` is A's messages
handed out a second while B sends. Each node runs with --fsync batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from typing import Any

import aiohttp
from harness import Server, percentile, unwind_on_signals

from broker.http.paths import PREFIX

TOPIC = "tenants"
BATCH = 1000
CONSUMERS = 4
PULL = 10


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


async def post(session: aiohttp.ClientSession, base: str, path: str, **params: Any) -> Any:
    async with session.post(f"{base}{PREFIX}{path}", data={k: str(v) for k, v in params.items()}) as r:
        body = await r.json(content_type=None)
        if r.status != 200 or body.get("code") != 200:
            raise RuntimeError(f"{path}: {r.status} {body}")
        return body


async def send_backlog(session: aiohttp.ClientSession, base: str, messages: int) -> None:
    for start in range(0, messages, BATCH):
        msgs = [{"msgId": f"a{i}", "msg": "a", "fairKey": "A"} for i in range(start, min(messages, start + BATCH))]
        async with session.post(f"{base}{PREFIX}sendMsgBatch", json={"topic": TOPIC, "msgs": msgs}) as r:
            if r.status != 200:
                raise RuntimeError(f"sendMsgBatch: {r.status} {await r.text()}")


async def run(base: str, messages: int, seconds: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        log(f"  sending {messages} of A's, due now")
        await send_backlog(session, base, messages)
        triggers: dict[str, int] = {}  # B's msgId -> its triggerTime
        lateness_ms: dict[str, int] = {}
        a_taken = 0
        done = asyncio.Event()

        async def tenant_b() -> None:
            n = 0
            while not done.is_set():
                body = await post(session, base, "sendMsg", topic=TOPIC, msgId=f"b{n}", msg="b", fairKey="B")
                triggers[f"b{n}"] = body["delayMsg"]["triggerTime"]
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 1.0)

        async def consumer() -> None:
            nonlocal a_taken
            while not done.is_set():
                body = await post(session, base, "pullMsg", topic=TOPIC, batch=PULL, ackTimeoutMillis=60_000)
                at_ms = now_ms()
                got = body["delayMsgList"]
                for m in got:
                    if m["msgId"].startswith("b"):
                        lateness_ms[m["msgId"]] = at_ms - m["triggerTime"]
                    else:
                        a_taken += 1
                    await post(session, base, "ackMsg", topic=TOPIC, msgId=m["msgId"])
                if a_taken >= messages:
                    done.set()
                if not got:
                    await asyncio.sleep(0.01)

        started = time.monotonic()
        tasks = [asyncio.create_task(tenant_b()), *(asyncio.create_task(consumer()) for _ in range(CONSUMERS))]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), seconds)
        done.set()
        await asyncio.gather(*tasks)
        elapsed_s = time.monotonic() - started
        end_ms = now_ms()
        unreleased = [i for i in triggers if i not in lateness_ms]
        values = sorted([*lateness_ms.values(), *(end_ms - triggers[i] for i in unreleased)])
        return {"b_sent": len(triggers), "b_unreleased": len(unreleased),
                "b_lateness_p50_ms": percentile(values, 0.50), "b_lateness_p99_ms": percentile(values, 0.99),
                "b_lateness_max_ms": values[-1] if values else None,
                "a_handed_out": a_taken, "a_drained": a_taken >= messages, "seconds": round(elapsed_s, 1),
                "a_per_s": round(a_taken / elapsed_s) if elapsed_s else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="tenant A's backlog, due at once")
    parser.add_argument("--seconds", type=float, default=120, help="longest run of B's sends, per node")
    args = parser.parse_args()
    unwind_on_signals()
    out: dict[str, Any] = {"messages": args.messages, "consumers": CONSUMERS, "pull_batch": PULL}
    for name in ("fair", "plain"):
        work = tempfile.mkdtemp(prefix=f"hourglass-fairness-{name}-")
        server = Server.start(f"{work}/data", "--fsync", "batch", log_path=f"{work}/serve.log")
        try:
            if name == "fair":
                status, body = server.post("setTopicConfig", topic=TOPIC, fairness="fairKey")
                assert status == 200, body
            log(f"{name}:")
            out[name] = asyncio.run(run(server.base, args.messages, args.seconds))
        finally:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
