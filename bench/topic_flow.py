"""Topic flow on a real `hourglass serve` (docs/api.md, "Flow"): a topic's
release rate and its pauses' resume policies, end to end over HTTP.
Prints ONE JSON object.

    .venv/bin/python bench/topic_flow.py                      # the full sizes
    .venv/bin/python bench/topic_flow.py --rate-messages 2000 --rate 200 \\
        --pause-messages 2000 --pause-s 5                     # a short run

  rate     --rate-messages (20,000) sent due within one second to a topic
           with releaseRate=--rate (2,000), pulled by --consumers long
           polls of 100: hand-outs counted per second from the first,
           the duration, lateness p50/p99 (hand-out minus trigger time,
           as the client sees it) and the node's smoothing and load
           lateness (/metrics' hourglass_release_lateness_seconds sums
           and counts by cause), and how many were handed out before their
           trigger time (early: must be 0); --rate-on-one-shard: all of
           them on one shard of a node of --shards (the rate is the node's)
  pause    per policy (hold, shift, expire): the topic paused, then
           --pause-messages (100,000) sent falling due over the pause of
           --pause-s (60) seconds; pulls during the pause count what was
           handed out (must be 0); then resumeTopic, its duration, and
           what followed: handed out (hold, shift: every one, none
           before its (shifted) trigger time; shift's error against
           the pause's length), ended with endReason `paused` (expire:
           every one, counted by listDeadMsg), lost (must be 0)

  --fault kill      the node SIGKILLed in the middle of each pause and
                    started again on its directory (and port)
  --fault failover  a 3-node cluster instead of one node: its leader
                    SIGKILLed in the middle of each pause, the calls going
                    on at the new leader (the old one restarted as a follower)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from cluster import Cluster
from harness import Server, percentile, unwind_on_signals

from broker.shards import layout, placement

BATCH_SEND = 1000
PULL = 100


def log(text: str) -> None:
    print(text, flush=True, file=sys.stderr)


def now_ms() -> int:
    return int(time.time() * 1000)


class Target:
    """The node the run talks to: one node (restarted by `fault` when the
    fault is a kill) or a 3-node cluster's leader (`fault` kills it)."""

    def __init__(self, work: str, fault: str, shards: str) -> None:
        self.fault_kind = fault
        self.flags = ("--fsync", "batch", "--shards", shards)
        self.data = f"{work}/data"
        self.cluster = Cluster.start(f"{work}/cluster", "--fsync", "batch") if fault == "failover" else None
        self.server = None if self.cluster else Server.start(self.data, *self.flags, log_path=f"{work}/serve.log")
        self.faults: list[dict[str, Any]] = []

    def node(self) -> Server:
        if self.cluster is None:
            assert self.server is not None
            return self.server
        return self.cluster.nodes[self.cluster.wait_leader()]

    def _asked(self, how: str, path: str, *args: Any, **params: Any) -> tuple[int, Any]:
        """A call answered (asked again while the node restarts or a leader is elected)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = getattr(self.node(), how)(path, *args, **params)
            except OSError:
                status, body = 503, None
            if status not in (502, 503) and not (isinstance(body, dict) and body.get("code") in (502, 503)):
                return status, body
            if time.monotonic() > deadline:
                return status, body
            time.sleep(0.1)

    def post(self, path: str, **params: Any) -> tuple[int, Any]:
        return self._asked("post", path, **params)

    def post_json(self, path: str, body: Any) -> tuple[int, Any]:
        return self._asked("post_json", path, body)

    def get(self, path: str, **params: Any) -> tuple[int, Any]:
        return self._asked("get", path, **params)

    def fault(self) -> None:
        """SIGKILL the node (and start it again) or the cluster's leader."""
        began = time.monotonic()
        if self.cluster is None:
            assert self.server is not None
            port = int(self.server.base.rsplit(":", 1)[1])
            self.server.kill()
            self.server = Server.start(self.data, *self.flags, port=port, log_path=self.server.log_path)
            self.faults.append({"kind": "kill", "back_s": round(time.monotonic() - began, 2)})
            return
        old = self.cluster.wait_leader()
        self.cluster.kill(old)
        new = self.cluster.wait_leader(exclude=old)
        self.faults.append({"kind": "failover", "killed": old, "leader": new,
                            "new_leader_s": round(time.monotonic() - began, 2)})
        self.cluster.restart(old, wait=False)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        elif self.server is not None:
            self.server.stop()


def send_due(server: Server | Target, topic: str, count: int, first_ms: int, spread_ms: int, prefix: str,
             on_shard: tuple[int, int] | None = None) -> dict[str, int]:
    """`count` messages with trigger times spread over [first_ms, first_ms +
    spread_ms); `on_shard` (shard, count): msgIds that shard owns alone."""
    sent: dict[str, int] = {}
    ids = (f"{prefix}{i:07d}" for i in range(count * (on_shard[1] if on_shard else 1) * 4))
    if on_shard is not None:
        ids = (msg_id for msg_id in ids if placement.owner(msg_id, on_shard[1]) == on_shard[0])
    for start in range(0, count, BATCH_SEND):
        msgs = []
        for i in range(start, min(count, start + BATCH_SEND)):
            trigger = first_ms + (i * spread_ms) // max(1, count)
            msg_id = next(ids)
            msgs.append({"msgId": msg_id, "msg": "x", "triggerTime": trigger})
            sent[msg_id] = trigger
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert status == 200 and isinstance(body, dict) and body.get("code") == 200, body
    return sent


def drain(server: Server | Target, topic: str, want: int, consumers: int, limit_s: float) -> list[tuple[int, dict[str, Any]]]:
    """Long polls (and acks) until `want` messages came: each with when it came."""
    got: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()
    deadline = time.monotonic() + limit_s

    def consume() -> None:
        while time.monotonic() < deadline:
            with lock:
                if len(got) >= want:
                    return
            status, body = server.post("longPollingMsg", topic=topic, batch=PULL, longPollingTimeoutMillis=500,
                                       ackTimeoutMillis=600_000)
            assert status == 200 and isinstance(body, dict), body
            at = now_ms()
            msgs = body["delayMsgList"]
            if msgs:
                server.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in msgs))
                with lock:
                    got.extend((at, m) for m in msgs)

    threads = [threading.Thread(target=consume) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def release_metrics(server: Server | Target) -> dict[str, float]:
    """The node's smoothing and load lateness sums and counts (/metrics)."""
    _, body = server.get("/metrics")
    text = body.decode() if isinstance(body, bytes) else json.dumps(body)
    out: dict[str, float] = {}
    for line in text.splitlines():
        for kind in ("smoothing", "load"):
            for part in ("sum", "count"):
                name = f'hourglass_release_lateness_seconds_{part}{{cause="{kind}"}}'
                if line.startswith(name + " "):
                    out[f"{kind}_{part}"] = float(line.split()[-1])
    return out


def run_rate(server: Server | Target, messages: int, rate: int, consumers: int,
             on_shard: tuple[int, int] | None = None) -> dict[str, Any]:
    topic = "rated"
    status, body = server.post("setTopicConfig", topic=topic, releaseRate=rate)
    assert status == 200, body
    start = now_ms() + 2000
    sent = send_due(server, topic, messages, start, 1000, "r", on_shard)
    got = drain(server, topic, messages, consumers, limit_s=messages / rate * 3 + 30)
    first = min(at for at, _ in got) if got else start
    per_second: dict[int, int] = {}
    for at, _ in got:
        per_second[(at - first) // 1000] = per_second.get((at - first) // 1000, 0) + 1
    late = sorted(at - m["triggerTime"] for at, m in got)
    metrics = release_metrics(server)
    full = [n for s, n in sorted(per_second.items())][1:-1]  # (the first and last seconds are partial)
    return {"messages": messages, "rate": rate, "handed_out": len({m["msgId"] for _, m in got}),
            "lost": len(set(sent) - {m["msgId"] for _, m in got}),
            "early": sum(1 for at, m in got if at < m["triggerTime"]),
            "duration_s": round((max(at for at, _ in got) - first) / 1000, 2) if got else None,
            "per_second": [per_second.get(s, 0) for s in range(max(per_second) + 1)] if per_second else [],
            "full_seconds_min_max": [min(full), max(full)] if full else None,
            "lateness_ms_p50": percentile(late, 0.5), "lateness_ms_p99": percentile(late, 0.99),
            "smoothing_s_mean": round(metrics["smoothing_sum"] / metrics["smoothing_count"], 3)
            if metrics.get("smoothing_count") else None,
            "load_s_mean": round(metrics["load_sum"] / metrics["load_count"], 3)
            if metrics.get("load_count") else None}


def run_pause(server: Target, policy: str, messages: int, pause_s: float, consumers: int) -> dict[str, Any]:
    topic = f"paused-{policy}"
    status, body = server.post("pauseTopic", topic=topic, onResume=policy)
    assert status == 200 and isinstance(body, dict), body
    paused_at = body["data"]["pause"]["pausedAt"]
    sent = send_due(server, topic, messages, now_ms() + 500, int(pause_s * 1000) - 1500, "p")
    during = 0
    until = time.monotonic() + pause_s - 1
    fault_at = time.monotonic() + pause_s / 2 if server.fault_kind != "none" else None
    while time.monotonic() < until:
        if fault_at is not None and time.monotonic() >= fault_at:
            fault_at = None
            server.fault()
        status, body = server.post("pullMsg", topic=topic, batch=PULL)
        assert status == 200 and isinstance(body, dict), body
        during += len(body["delayMsgList"])
        time.sleep(0.2)
    asked = now_ms()
    status, body = server.post("resumeTopic", topic=topic)
    answered = now_ms()
    assert status == 200, body
    out: dict[str, Any] = {"messages": messages, "pause_s": pause_s, "handed_out_during_pause": during,
                           "resume_s": round((answered - asked) / 1000, 3), "fault": server.faults[-1:]}
    if policy == "expire":
        ended = 0
        cursor = None
        while True:
            params: dict[str, Any] = {"topic": topic, "status": 5, "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            status, body = server.get("listDeadMsg", **params)
            assert status == 200 and isinstance(body, dict), body
            ended += sum(1 for m in body["delayMsgList"] if m.get("endReason") == "paused")
            cursor = body.get("cursor")
            if not cursor:
                break
        status, body = server.post("pullMsg", topic=topic, batch=PULL)
        out.update(expired_paused=ended, lost=messages - ended,
                   handed_out_after=len(body["delayMsgList"]) if isinstance(body, dict) else None)
        return out
    limit_s = 60 + pause_s + messages / 2000
    got = drain(server, topic, messages, consumers, limit_s)
    ids = {m["msgId"] for _, m in got}
    out.update(handed_out_after=len(ids), lost=len(set(sent) - ids),
               early=sum(1 for at, m in got if at < m["triggerTime"]))
    if policy == "shift":
        errors = sorted(abs(m["triggerTime"] - sent[m["msgId"]] - (asked - paused_at)) for _, m in got)
        out.update(shift_error_ms_p50=percentile(errors, 0.5), shift_error_ms_max=errors[-1] if errors else None,
                   resume_answer_ms=answered - asked)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-messages", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=2_000, help="releaseRate, messages a second")
    parser.add_argument("--pause-messages", type=int, default=100_000)
    parser.add_argument("--pause-s", type=float, default=60)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--shards", default="1")
    parser.add_argument("--rate-on-one-shard", action="store_true",
                        help="the rate part's messages all on the node's last shard (msgIds it owns)")
    parser.add_argument("--parts", default="rate,hold,shift,expire")
    parser.add_argument("--fault", choices=("none", "kill", "failover"), default="none",
                        help="in the middle of each pause: none, the node SIGKILLed and restarted, "
                             "or a 3-node cluster's leader SIGKILLed")
    args = parser.parse_args()
    unwind_on_signals()
    parts = args.parts.split(",")
    out: dict[str, Any] = {"shards": args.shards, "consumers": args.consumers, "fault": args.fault}
    work = tempfile.mkdtemp(prefix="hourglass-topic-flow-")
    server = Target(work, args.fault, args.shards)
    try:
        if "rate" in parts:
            log("rate:")
            count = layout.cores() if args.shards == layout.AUTO else int(args.shards)
            on_shard = (count - 1, count) if args.rate_on_one_shard and count > 1 else None
            out["rate"] = run_rate(server, args.rate_messages, args.rate, args.consumers, on_shard)
            out["rate"]["on_one_shard"] = on_shard is not None
        for policy in ("hold", "shift", "expire"):
            if policy in parts:
                log(f"pause, {policy}:")
                out[policy] = run_pause(server, policy, args.pause_messages, args.pause_s, args.consumers)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
