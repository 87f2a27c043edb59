"""Push delivery against a real subscriber (bench/push_subscriber.py, an
aiohttp server in its own process), beside a pull consumer's figures of
the same run. Prints ONE JSON object.

    .venv/bin/python bench/push.py                       # the full run (docs/benchmarks.md)
    .venv/bin/python bench/push.py --quick               # small sizes, about a minute

Scenarios (each on its own topic of one `hourglass serve --push-allow 127.0.0.1`):

  steady     --rate messages due a second for --seconds, concurrency 32:
             delivered, lateness (subscriber receive - trigger) p50/p99/max,
             early; `pull` the same schedule on another topic taken by a
             long-polling consumer (batch 100, acks in one ackMsg each)
  burst      --burst messages due within one second, concurrency 64: the
             time from the first trigger to the last delivery
  outage     --outage-msgs due now while the subscriber answers 500 for
             --outage-s, then 200: lost, and the gaps between one message's
             deliveries (the backoff)
  kill       --kill-msgs due over --seconds, the node SIGKILLed halfway and
             restarted: lost, duplicates
  slow       a subscriber that never answers and one whose answer never
             ends, each with a backlog, while a steady topic runs: its
             lateness, and the node's RSS before and after
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from harness import ROOT, Server, free_port, memory_mb, percentile, request

SUBSCRIBER = os.path.join(ROOT, "bench", "push_subscriber.py")


class Subscriber:
    def __init__(self, directory: str, mode: str = "ok") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.record = os.path.join(directory, f"received-{self.port}.jsonl")
        open(self.record, "w").close()
        self.proc = subprocess.Popen([sys.executable, SUBSCRIBER, str(self.port), self.record, mode])
        deadline = time.monotonic() + 20
        while True:
            try:
                self.mode(mode)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def mode(self, mode: str) -> None:
        status, _ = request(f"http://127.0.0.1:{self.port}/_mode", data=json.dumps({"mode": mode}).encode(),
                            headers={"Content-Type": "application/json"}, timeout=5)
        if status != 200:
            raise OSError(f"mode answered {status}")

    def received(self) -> list[dict[str, Any]]:
        with open(self.record) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def send_schedule(server: Server, topic: str, triggers_ms: list[int], **extra: object) -> list[str]:
    ids = []
    for start in range(0, len(triggers_ms), 1000):
        msgs = []
        for trigger in triggers_ms[start:start + 1000]:
            msg_id = uuid.uuid4().hex
            ids.append(msg_id)
            msgs.append({"msgId": msg_id, "msg": "x" * 100, "triggerTime": trigger, **extra})
        code, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        if code != 200:
            raise RuntimeError(f"sendMsgBatch answered {code}: {body}")
    return ids


def subscribe(server: Server, topic: str, url: str, **params: object) -> None:
    code, body = server.post("subscribe", topic=topic, url=url, **params)
    if code != 200:
        raise RuntimeError(f"subscribe answered {code}: {body}")


def wait_delivered(subscriber: Subscriber, ids: set[str], limit_s: float, since_ms: float = 0) -> list[dict[str, Any]]:
    """What the subscriber received once each of `ids` came at or after `since_ms` (or the limit passed)."""
    deadline = time.monotonic() + limit_s
    while True:
        got = subscriber.received()
        if ids <= {r["headers"]["Hourglass-Msg-Id"] for r in got if r["receivedMs"] >= since_ms} or \
                time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def lateness(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Of each message's first delivery: receive - trigger, in ms."""
    first: dict[str, float] = {}
    for r in records:
        body = json.loads(r["body"])
        first.setdefault(body["msgId"], r["receivedMs"] - body["triggerTime"])
    values = sorted(first.values())
    return {"delivered": len(values), "lateness_p50_ms": percentile(values, 0.5),
            "lateness_p99_ms": percentile(values, 0.99), "lateness_max_ms": percentile(values, 1.0),
            "early": sum(1 for v in values if v < 0)}


def pull_consumer(server: Server, topic: str, count: int, limit_s: float, out: list[float]) -> None:
    """Long polls of `topic` until `count` messages came: receive - trigger of each."""
    deadline = time.monotonic() + limit_s
    seen: set[str] = set()
    while len(seen) < count and time.monotonic() < deadline:
        code, body = server.post("longPollingMsg", topic=topic, batch=100, longPollingTimeoutMillis=1000)
        now_ms = time.time() * 1000
        if code != 200:
            continue
        msgs = body["delayMsgList"]
        for m in msgs:
            if m["msgId"] not in seen:
                seen.add(m["msgId"])
                out.append(now_ms - m["triggerTime"])
        if msgs:
            server.post_json("ackMsg", {"topic": topic, "msgIds": [m["msgId"] for m in msgs]})


def steady(server: Server, directory: str, rate: int, seconds: float, with_pull: bool = True) -> dict[str, Any]:
    sub = Subscriber(directory)
    try:
        topic, pull_topic = "steady-" + uuid.uuid4().hex[:6], "pull-" + uuid.uuid4().hex[:6]
        subscribe(server, topic, sub.url, concurrency=32)
        n = int(rate * seconds)
        t0 = int(time.time() * 1000) + 3000 + n // 5  # time to send both schedules first
        triggers = [t0 + int(i * 1000 / rate) for i in range(n)]
        ids = set(send_schedule(server, topic, triggers))
        pulled: list[float] = []
        thread = None
        if with_pull:
            send_schedule(server, pull_topic, triggers)
            thread = threading.Thread(target=pull_consumer, args=(server, pull_topic, n, seconds + 60, pulled))
            thread.start()
        sent_ahead_ms = t0 - time.time() * 1000
        records = wait_delivered(sub, ids, (t0 - time.time() * 1000) / 1000 + seconds + 60)
        if thread is not None:
            thread.join()
        result = {"msgs": n, "sent_ahead_ms": round(sent_ahead_ms), **lateness(records),
                  "duplicates": len(records) - len({r["headers"]["Hourglass-Msg-Id"] for r in records})}
        if with_pull:
            pulled.sort()
            result["pull"] = {"delivered": len(pulled), "lateness_p50_ms": percentile(pulled, 0.5),
                              "lateness_p99_ms": percentile(pulled, 0.99), "early": sum(1 for v in pulled if v < 0)}
        return result
    finally:
        sub.stop()


def burst(server: Server, directory: str, count: int) -> dict[str, Any]:
    sub = Subscriber(directory)
    try:
        topic = "burst-" + uuid.uuid4().hex[:6]
        subscribe(server, topic, sub.url, concurrency=64)
        t0 = int(time.time() * 1000) + 3000 + count // 5
        ids = set(send_schedule(server, topic, [t0 + int(i * 1000 / count) for i in range(count)]))
        records = wait_delivered(sub, ids, (t0 - time.time() * 1000) / 1000 + 60)
        last = max((r["receivedMs"] for r in records), default=t0)
        return {"msgs": count, **lateness(records), "first_trigger_to_last_delivery_s": round((last - t0) / 1000, 3)}
    finally:
        sub.stop()


def outage(server: Server, directory: str, count: int, outage_s: float) -> dict[str, Any]:
    sub = Subscriber(directory, "fail")
    try:
        topic = "outage-" + uuid.uuid4().hex[:6]
        subscribe(server, topic, sub.url, concurrency=32)
        now = int(time.time() * 1000)
        ids = set(send_schedule(server, topic, [now] * count, maxRetry=100, ttlMillis=3_600_000))
        time.sleep(outage_s)
        sub.mode("ok")
        recovered_ms = time.time() * 1000
        records = wait_delivered(sub, ids, 400, since_ms=recovered_ms)
        by_id: dict[str, list[float]] = collections.defaultdict(list)
        for r in records:
            by_id[r["headers"]["Hourglass-Msg-Id"]].append(r["receivedMs"])
        gaps: dict[int, list[float]] = collections.defaultdict(list)  # gap after failure n
        for times in by_id.values():
            for n, (a, b) in enumerate(itertools.pairwise(times), start=1):
                gaps[n].append(b - a)
        delivered = {r["headers"]["Hourglass-Msg-Id"] for r in records if r["receivedMs"] >= recovered_ms}
        return {"msgs": count, "outage_s": outage_s, "lost": len(ids - delivered),
                "last_delivery_after_recovery_s": round((max(r["receivedMs"] for r in records) - recovered_ms)
                                                         / 1000, 3),
                "backoff_gap_ms_min_median_max": {n: [round(min(g)), round(sorted(g)[len(g) // 2]), round(max(g))]
                                                  for n, g in sorted(gaps.items()) if n <= 10}}
    finally:
        sub.stop()


def kill(directory: str, count: int, seconds: float) -> dict[str, Any]:
    data = os.path.join(directory, "kill-data")
    port = free_port()
    flags = ("--push-allow", "127.0.0.1", "--port", str(port))
    server = Server.start(data, *flags[:2], port=port, log_path=os.path.join(directory, "kill.log"))
    sub = Subscriber(directory)
    try:
        topic = "kill-" + uuid.uuid4().hex[:6]
        subscribe(server, topic, sub.url, concurrency=32)
        t0 = int(time.time() * 1000) + 2000 + count // 5
        ids = set(send_schedule(server, topic, [t0 + int(i * seconds * 1000 / count) for i in range(count)]))
        time.sleep(max(0.0, (t0 - time.time() * 1000) / 1000 + seconds / 2))
        server.kill()
        killed_ms = time.time() * 1000
        server = Server.start(data, *flags[:2], port=port, log_path=os.path.join(directory, "kill.log"))
        records = wait_delivered(sub, ids, seconds + 90)  # in flight at the kill: at the ack deadline (<= 30 s)
        delivered = [r["headers"]["Hourglass-Msg-Id"] for r in records]
        return {"msgs": count, "killed_after_s": round((killed_ms - t0) / 1000, 3), "lost": len(ids - set(delivered)),
                "duplicates": len(delivered) - len(set(delivered)),
                "all_delivered_s_after_kill": round((max(r["receivedMs"] for r in records) - killed_ms) / 1000, 3)}
    finally:
        sub.stop()
        server.kill()


def slow(server: Server, directory: str, rate: int, seconds: float) -> dict[str, Any]:
    hang, stream = Subscriber(directory, "hang"), Subscriber(directory, "stream")
    try:
        rss_before = memory_mb(server.proc.pid)
        for sub, name in ((hang, "hang"), (stream, "stream")):
            topic = f"{name}-" + uuid.uuid4().hex[:6]
            subscribe(server, topic, sub.url, concurrency=64, timeoutMillis=10_000)
            send_schedule(server, topic, [int(time.time() * 1000)] * 2000)
        result = steady(server, directory, rate, seconds, with_pull=False)
        return {"steady_beside": result, "rss_before_mb": rss_before.get("rss_mb"),
                "rss_after_mb": memory_mb(server.proc.pid).get("rss_mb"),
                "stream_received": len(stream.received()), "hang_received": len(hang.received())}
    finally:
        hang.stop()
        stream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--burst", type=int, default=20_000)
    parser.add_argument("--outage-s", type=float, default=60)
    parser.add_argument("--outage-msgs", type=int, default=1000)
    parser.add_argument("--kill-msgs", type=int, default=10_000)
    parser.add_argument("--only", default="steady,burst,outage,kill,slow")
    args = parser.parse_args()
    if args.quick:
        args.rate, args.seconds, args.burst, args.outage_s, args.outage_msgs, args.kill_msgs = 200, 3, 1000, 5, 50, 300
    only = set(args.only.split(","))
    directory = tempfile.mkdtemp(prefix="hg-push-")
    server = Server.start(os.path.join(directory, "data"), "--push-allow", "127.0.0.1",
                          log_path=os.path.join(directory, "serve.log"))
    out: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "only"}}
    try:
        if "steady" in only:
            out["steady"] = steady(server, directory, args.rate, args.seconds)
        if "burst" in only:
            out["burst"] = burst(server, directory, args.burst)
        if "outage" in only:
            out["outage"] = outage(server, directory, args.outage_msgs, args.outage_s)
        if "slow" in only:
            out["slow"] = slow(server, directory, args.rate, args.seconds)
        out["node_rss_mb"] = memory_mb(server.proc.pid).get("rss_mb")
    finally:
        server.stop()
    if "kill" in only:
        out["kill"] = kill(directory, args.kill_msgs, args.seconds)
    print(json.dumps(out))
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
