"""Leases (docs/api.md, "Leases"): what an extension costs the node, and a
message held by its consumer's extensions in real time. Prints ONE JSON
object.

    .venv/bin/python bench/leases.py                   # both parts
    HOURGLASS_SERVE_PYTHON=.venv/bin/python .venv/bin/python bench/leases.py   # the installed (compiled) build
    .venv/bin/python bench/leases.py --part cost --serve-flags="--shards 2"
    .venv/bin/python bench/leases.py --part hold --hold-s 600

cost: --rounds rounds; in each, for each kind in turn, --messages due
messages sent and pulled 1,000 a call (ackTimeoutMillis 10 min), the
node left to go idle, then one pass over them, 1,000 ids a call, timed
and its server CPU read from /proc (every process of the node):
extendMsg with msgIds and deliveryIds; ackMsg with msgIds and
deliveryIds (fenced); ackMsg with msgIds alone (camellia's ack). Target
(issue 64): extending 1,000 messages in one call costs no more server
CPU than acking them in one call.

hold: one message pulled by broker.client.Consumer in a child process,
its handler sleeping for ever, ackTimeoutMillis 30 s: the consumer
extends it every 10 s. Every second for --hold-s the bench reads it: it
must stay consuming with retry 1 (0 redeliveries). Then the consumer is
killed (SIGKILL) and the bench long-polls: the message must come back
within the ack timeout + 1 s of the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from harness import CpuMeter, Server, child_env, serve_version

TOPIC = "leases"
CALL_IDS = 1000


def _pull_all(server: Server, count: int) -> list[dict]:
    got: list[dict] = []
    while len(got) < count:
        code, body = server.post("pullMsg", topic=TOPIC, batch=CALL_IDS, ackTimeoutMillis=600_000)
        assert code == 200 and body["code"] == 200, body
        if not body["delayMsgList"]:
            time.sleep(0.05)
        got += body["delayMsgList"]
    return got


def _send_due(server: Server, prefix: str, count: int) -> None:
    for at in range(0, count, 500):
        msgs = [{"msgId": f"{prefix}-{i}", "msg": "x"} for i in range(at, min(count, at + 500))]
        code, body = server.post_json("sendMsgBatch", {"topic": TOPIC, "msgs": msgs})
        assert code == 200 and body["code"] == 200, body


def _rounds(server: Server, path: str, messages: list[dict], rounds: int, fenced: bool,
            extra: dict) -> dict[str, float]:
    """`rounds` passes over `messages`, CALL_IDS a call: µs of server CPU a
    message and ms a call (median)."""
    meter = CpuMeter({"server": server.proc.pid})
    took = []
    calls = 0
    for _ in range(rounds):
        for at in range(0, len(messages), CALL_IDS):
            part = messages[at:at + CALL_IDS]
            body = {"topic": TOPIC, "msgIds": [m["msgId"] for m in part], **extra}
            if fenced:
                body["deliveryIds"] = [m["deliveryId"] for m in part]
            began = time.perf_counter()
            code, answer = server.post_json(path, body)
            took.append((time.perf_counter() - began) * 1000)
            assert code == 200 and answer["code"] == 200, answer
            calls += 1
    cpu_s = meter.used()["server_cpu_s"]
    took.sort()
    return {"calls": calls, "messages": calls * CALL_IDS, "server_cpu_s": cpu_s,
            "server_cpu_us_a_message": round(cpu_s / (calls * CALL_IDS) * 1e6, 2),
            "ms_a_call_p50": round(took[len(took) // 2], 2)}


def _idle(server: Server, most_s: float = 20.0) -> None:
    """Until the node used under 2% of a core over 0.5 s (what the last
    sends and pulls left it to do is done), at most `most_s`."""
    gave_up = time.monotonic() + most_s
    while time.monotonic() < gave_up:
        meter = CpuMeter({"server": server.proc.pid})
        time.sleep(0.5)
        if meter.used()["server_cpu_s"] < 0.01:
            return


def cost(server: Server, count: int, rounds: int) -> dict:
    """Each round, on `count` messages sent due and pulled afresh for each
    kind, with the node idle before each pass: extendMsg, fenced ackMsg,
    plain ackMsg, each one pass 1,000 ids a call. The kinds alternate
    round by round, so a slow moment of the machine falls on all."""
    kinds = {"extend_1000_a_call": ("extendMsg", True, {"ackTimeoutMillis": 600_000}),
             "fenced_ack_1000_a_call": ("ackMsg", True, {}),
             "plain_ack_1000_a_call": ("ackMsg", False, {})}
    totals = {name: {"calls": 0, "messages": 0, "server_cpu_s": 0.0} for name in kinds}
    took: dict[str, list[float]] = {name: [] for name in kinds}
    per_round: dict[str, list[float]] = {name: [] for name in kinds}
    for r in range(rounds):
        for k, (name, (path, fenced, extra)) in enumerate(kinds.items()):
            _send_due(server, f"{k}-{r}", count)
            held = _pull_all(server, count)
            _idle(server)
            result = _rounds(server, path, held, 1, fenced, extra)
            if path == "extendMsg":  # (the extended ones acked, so the next pulls find only new ones)
                _rounds(server, "ackMsg", held, 1, False, {})
            for key in ("calls", "messages", "server_cpu_s"):
                totals[name][key] += result[key]
            took[name].append(result["ms_a_call_p50"])
            per_round[name].append(result["server_cpu_us_a_message"])
    for name, result in totals.items():
        result["server_cpu_s"] = round(result["server_cpu_s"], 2)
        result["server_cpu_us_a_message"] = round(result["server_cpu_s"] / result["messages"] * 1e6, 2)
        result["server_cpu_us_a_message_each_round"] = per_round[name]
        result["ms_a_call_p50"] = sorted(took[name])[len(took[name]) // 2]
    extend = totals["extend_1000_a_call"]["server_cpu_us_a_message"]
    return {**totals,
            "extend_over_fenced_ack_cpu": round(extend / totals["fenced_ack_1000_a_call"]["server_cpu_us_a_message"], 3),
            "extend_over_plain_ack_cpu": round(extend / totals["plain_ack_1000_a_call"]["server_cpu_us_a_message"], 3)}


CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from broker.client import Consumer, DelayQueueClient

    async def main(url, topic):
        async with DelayQueueClient(url) as client:
            async def handler(msg):
                print("handling", msg.msg_id, msg.delivery_id, flush=True)
                await asyncio.sleep(10**9)
            consumer = Consumer(client, topic, handler, concurrency=1, ack_timeout_ms=30_000, long_poll_ms=1000)
            await consumer.run()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def hold(server: Server, hold_s: float, root: str) -> dict:
    _, body = server.post("sendMsg", topic=TOPIC, msgId="held", msg="long work")
    assert body["code"] == 200, body
    script = os.path.join(root, "consumer.py")
    with open(script, "w") as f:
        f.write(CONSUMER)
    log_path = os.path.join(root, "consumer.log")
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, script, server.base, TOPIC], stdout=log, stderr=subprocess.STDOUT,
                                 env=child_env())
    try:
        began = time.monotonic()
        while time.monotonic() - began < 30:
            _, body = server.post("getMsg", topic=TOPIC, msgId="held")
            if body["code"] == 200 and body["delayMsg"]["status"] == 3:
                break
            time.sleep(0.1)
        held_from = time.monotonic()
        reads, redeliveries, worst = 0, 0, (3, 1)
        while time.monotonic() - held_from < hold_s:
            _, body = server.post("getMsg", topic=TOPIC, msgId="held")
            m = body["delayMsg"]
            reads += 1
            if (m["status"], m["retry"]) != (3, 1):
                worst = (m["status"], m["retry"])
                redeliveries = max(redeliveries, m["retry"] - 1)
            time.sleep(1)
        held_s = time.monotonic() - held_from
        _, metrics = server.get("getTopicInfo", topic=TOPIC)
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        child.wait(timeout=10)
        back_after_s = None
        while time.monotonic() - killed < 45:
            _, body = server.post("longPollingMsg", topic=TOPIC, longPollingTimeoutMillis=1000,
                                     ackTimeoutMillis=60_000)
            if body["delayMsgList"]:
                back_after_s = round(time.monotonic() - killed, 2)
                again = body["delayMsgList"][0]
                break
    finally:
        if child.poll() is None:
            child.kill()
    with open(log_path) as f:
        log_text = f.read()
    return {"held_s": round(held_s, 1), "reads": reads, "redeliveries_while_held": redeliveries,
            "status_retry_seen": list(worst), "longest_held_ms_at_end": metrics["data"].get("longestHeldMillis"),
            "redelivered_after_kill_s": back_after_s,
            "redelivered_retry": again["retry"] if back_after_s is not None else None,
            "consumer_log_lines": len(log_text.splitlines())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("cost", "hold", "both"), default="both")
    p.add_argument("--messages", type=int, default=20_000, help="messages held for the cost part (20,000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each kind one pass a round (5)")
    p.add_argument("--hold-s", type=float, default=600.0, help="seconds the hold part keeps its message (600)")
    p.add_argument("--serve-flags", default="", help="more flags for hourglass serve")
    args = p.parse_args()
    flags = ["--max-inflight", str(max(args.messages, 1000)), "--max-inflight-total", str(max(args.messages, 1000)),
             "--max-ack-timeout-ms", "600000",
             *shlex.split(args.serve_flags)]
    out: dict = {"benchmark": "bench/leases.py", "build": serve_version(), "flags": flags}
    with tempfile.TemporaryDirectory(prefix="hg-leases-") as root:
        server = Server.start(os.path.join(root, "data"), *flags, log_path=os.path.join(root, "serve.log"))
        try:
            if args.part in ("cost", "both"):
                out["cost"] = cost(server, args.messages, args.rounds)
            if args.part in ("hold", "both"):
                out["hold"] = hold(server, args.hold_s, root)
        finally:
            server.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
