"""camellia-delay-queue's Redis layout, written as its server writes it,
for the tests and the benchmark of `hourglass import --from-camellia`.

Each step follows netease-im/camellia's
camellia-delay-queue/camellia-delay-queue-server/src/main/java/com/netease/
nim/camellia/delayqueue/server/CamelliaDelayQueueServer.java (the keys:
its msgKey, waitingQueueKey, readyQueueKey, ackQueueKey, topicsKey, built
by camellia-core's CacheUtil.buildCacheKey, the parts joined by "|"):

    send     sendMsg: the message's JSON (PSETEX, expireTime - now +
             3 x endLifeMsgExpireMillis), then ZADD waiting by trigger time
             (a delay above 100 ms: status 1) or LPUSH ready (status 2),
             then ZADD topics
    trigger  checkTriggerMsg: ZREM waiting, LPUSH ready (the JSON is not
             written: its status stays 1)
    pull     pullMsg's PULL_MSG_SCRIPT (RPOP ready, ZADD ack at now + ack
             timeout), then checkMsgLife: status 3, retry + 1, PSETEX
    ack      ackMsg: status 4, PSETEX endLifeMsgExpireMillis; ZREM ack
    timeout  checkTimeoutMsg: ZREM ack, LPUSH ready (status stays 3)

The JSON is fastjson's of CamelliaDelayMsg (its fields in name order).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

END_LIFE_MS = 24 * 3600 * 1000  # CamelliaDelayQueueServerConfig's endLifeMsgExpireMillis default


def msg_key(ns: str, topic: str, msg_id: str) -> str:
    return f"camellia_delay_queue_msg|{ns}|{topic}|{msg_id}"


def waiting_key(ns: str, topic: str) -> str:
    return f"camellia_delay_queue_waiting|{{|{ns}|{topic}|}}"


def ready_key(ns: str, topic: str) -> str:
    return f"camellia_delay_queue_ready|{{|{ns}|{topic}|}}"


def ack_key(ns: str, topic: str) -> str:
    return f"camellia_delay_queue_ack|{{|{ns}|{topic}|}}"


def topics_key(ns: str) -> str:
    return f"camellia_delay_queue_topics|{ns}"


@dataclass
class CamelliaMsg:
    topic: str
    msgId: str
    msg: str
    produceTime: int
    triggerTime: int
    expireTime: int
    maxRetry: int
    retry: int = 0
    status: int = 1

    def json(self) -> str:
        return json.dumps(dict(sorted(vars(self).items())), separators=(",", ":"), ensure_ascii=False)


class Layout:
    """A camellia server's writes for one namespace, through a redis-py
    client (sync) `r`; each call one pipeline."""

    def __init__(self, r: object, ns: str) -> None:
        self.r = r
        self.ns = ns

    def _save(self, pipe: object, m: CamelliaMsg, now: int, end_life: bool) -> None:
        ttl = END_LIFE_MS if end_life else m.expireTime - now + END_LIFE_MS * 3
        pipe.psetex(msg_key(self.ns, m.topic, m.msgId), max(1, ttl), m.json())  # type: ignore[attr-defined]

    def send(self, msgs: Sequence[CamelliaMsg], now: int) -> None:
        pipe = self.r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for m in msgs:
            delay = m.triggerTime - now
            m.status = 2 if delay <= 100 else 1
            self._save(pipe, m, now, False)
            if m.status == 1:
                pipe.zadd(waiting_key(self.ns, m.topic), {m.msgId: m.triggerTime})
            else:
                pipe.lpush(ready_key(self.ns, m.topic), m.msgId)
            pipe.zadd(topics_key(self.ns), {m.topic: now})
        pipe.execute()

    def trigger(self, msgs: Sequence[CamelliaMsg]) -> None:
        pipe = self.r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for m in msgs:
            pipe.zrem(waiting_key(self.ns, m.topic), m.msgId)
            pipe.lpush(ready_key(self.ns, m.topic), m.msgId)
        pipe.execute()

    def pull(self, msgs: Sequence[CamelliaMsg], now: int, ack_timeout_ms: int) -> None:
        pipe = self.r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for m in msgs:
            pipe.lrem(ready_key(self.ns, m.topic), 0, m.msgId)  # (the RPOP of this one)
            pipe.zadd(ack_key(self.ns, m.topic), {m.msgId: now + ack_timeout_ms})
            m.status, m.retry = 3, m.retry + 1
            self._save(pipe, m, now, False)
        pipe.execute()

    def ack(self, msgs: Sequence[CamelliaMsg], now: int) -> None:
        pipe = self.r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for m in msgs:
            m.status = 4
            self._save(pipe, m, now, True)
            pipe.zrem(ack_key(self.ns, m.topic), m.msgId)
        pipe.execute()

    def timeout(self, msgs: Sequence[CamelliaMsg]) -> None:
        pipe = self.r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for m in msgs:
            pipe.zrem(ack_key(self.ns, m.topic), m.msgId)
            pipe.lpush(ready_key(self.ns, m.topic), m.msgId)
        pipe.execute()


@dataclass
class Populated:
    """What `populate` wrote: the messages an import must bring, each
    with the trigger time it must have, and how many it must leave."""

    expected: dict[tuple[str, str], int]  # (topic, msgId) -> trigger time on the new node
    left: dict[str, int]  # why not brought -> how many


def populate(r: object, ns: str, n: int, now: int, topics: int = 8, body: str = "x" * 64) -> Populated:
    """`n` messages of namespace `ns` in every state camellia's server
    leaves them, as it leaves them; plus 10 of a namespace "ns|other",
    whose keys SCAN's pattern for `ns` also matches and which an import of
    `ns` must leave ("another namespace")."""
    layout = Layout(r, ns)
    expected: dict[tuple[str, str], int] = {}
    left = {"ended": 0, "expired": 0, "retries used": 0}
    kinds: dict[str, list[CamelliaMsg]] = {k: [] for k in ("waiting", "due", "consuming", "timed out", "acked",
                                                          "expired", "used")}
    for i in range(n):
        topic = f"topic-{i % topics}"
        kind = i % 20
        trigger = now + 3_600_000 + (i * 7919 % 31_536_000) * 1000  # within a year
        m = CamelliaMsg(topic, f"id-{i:07d}", f"{body}{i}", now - 5000, trigger, trigger + 3_600_000, 3)
        if kind < 12:  # waiting
            kinds["waiting"].append(m)
            expected[(topic, m.msgId)] = trigger
        elif kind < 15:  # due: moved to ready by its trigger check (its JSON still says 1)
            m.triggerTime, m.expireTime = now - 1000 - i, now + 3_600_000
            kinds["due"].append(m)
            expected[(topic, m.msgId)] = m.triggerTime
        elif kind < 17:  # pulled, not acked: consuming until its ack deadline
            m.triggerTime, m.expireTime = now - 2000, now + 3_600_000
            kinds["consuming"].append(m)
            expected[(topic, m.msgId)] = now - 100 + 30_000
        elif kind == 17:  # pulled, timed out, back in ready (status stays 3, retry 1)
            m.triggerTime, m.expireTime = now - 60_000, now + 3_600_000
            kinds["timed out"].append(m)
            expected[(topic, m.msgId)] = m.triggerTime
        elif kind == 18:  # acked
            m.triggerTime = now - 2000
            kinds["acked"].append(m)
            left["ended"] += 1
        elif i % 40 == 19:  # past its expiry, still in ready (camellia ends it at its next look)
            m.triggerTime, m.expireTime = now - 20_000, now - 10_000
            kinds["expired"].append(m)
            left["expired"] += 1
        else:  # its deliveries used: retry 4 > maxRetry 3, back in ready
            m.triggerTime, m.expireTime, m.retry = now - 20_000, now + 3_600_000, 3
            kinds["used"].append(m)
            left["retries used"] += 1
    for name, msgs in kinds.items():
        for start in range(0, len(msgs), 1000):
            part = msgs[start:start + 1000]
            if name == "waiting":
                layout.send(part, now)
                continue
            layout.send(part, now - 70_000)
            layout.trigger(part)
            if name in ("consuming", "acked"):
                layout.pull(part, now - 100, 30_000)
            if name in ("timed out", "used"):
                layout.pull(part, now - 50_000, 30_000)
                layout.timeout(part)
            if name == "acked":
                layout.ack(part, now - 50)
    other = Layout(r, ns + "|other")
    other.send([CamelliaMsg("t", f"o-{i}", "other", now, now + 60_000, now + 3_660_000, 3) for i in range(10)], now)
    return Populated(expected, left)
