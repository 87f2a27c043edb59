"""The Redis backend's serial-key structures (broker/redis/keys.py) checked
whole after every step of a random history on two brokers sharing one real
redis-server on a FakeClock: sends (keys, tags, priorities, delays, short
ttls), pulls (tagged or not, a pusher's or a consumer's), acks and nacks,
deletes, reschedules, failed pushes filed for later, give-backs, bulk
deletes and reschedules by key, redrives, keys paused and resumed (hold,
shift, expire: broker.redis.flow), fairness=fairKey turned on and off
(the messages' fairKeys "", A, B), the mover's ticks and a node
restarted. After each step, read in one MULTI:

- `busy` names, for each busy key, a CONSUMING message of that key, and
  every CONSUMING keyed message is its key's `busy` one (one at a time);
- `keyready` holds exactly the READY keyed messages, `expire` exactly
  the READY messages, `held` exactly the CONSUMING messages a node holds;
- `ready` holds exactly the READY unkeyed messages and, of each free key
  not paused, its best READY one (`tagged` the same, with their tags);
- `keyed` holds exactly the stored keyed messages;
- `fair` holds "<fairKey>\\0<rk>" of exactly the `ready` members while
  the topic's fairness is fairKey, and nothing otherwise.

At the end everything is acked or deleted and purged: every per-key
structure is empty again (a key with no message costs nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from fakes import FakeClock
from test_redis_keys import START_MS, TOPIC, Node

from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest, RescheduleMsgsRequest
from broker.core.params import AckRequest, DeleteRequest, LongPollRequest, NewSend
from broker.flow.keeper import TopicFlow
from broker.flow.settings import OnResume, PauseRequest, TopicConfig
from broker.redis.keys import RedisConfig, TopicKeys
from storage.entry import Status
from storage.errors import Conflict, NotFound
from storage.store import NewMessage

KEYS = ("k1", "k2", "")
TAGS = ("", "x", "y")
RETENTION_MS = 50


class InvariantMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        prefix = "hg-inv-" + uuid.uuid4().hex[:12]
        self.clock = FakeClock(START_MS)
        self.nodes = [Node(self.redis_url, prefix, self.clock) for _ in range(2)]
        for node in self.nodes:
            node.config = RedisConfig(key_prefix=prefix, retention_ms=RETENTION_MS, lease_ms=200)
            self.run(node.open())
        self.keys = TopicKeys.of(prefix, TOPIC)
        self.ids: list[str] = []
        self.paused: set[str] = set()
        self.fair = False

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        try:
            if self.ids:
                self.run(self.drain())
        finally:
            for node in self.nodes:
                self.run(node.close())
            self.loop.close()

    async def drain(self) -> None:
        """Every message deleted and purged: nothing per key is left."""
        node = self.nodes[0]
        for key in sorted(self.paused):
            await self.flow(0).resume(PauseRequest(TOPIC, key, OnResume.HOLD))
        for msg_id in self.ids:
            with contextlib.suppress(NotFound):
                await node.broker.delete(DeleteRequest(TOPIC, msg_id, False))
        await node.advance_to(node.now + RETENTION_MS + 1)
        await node.advance_to(node.now + 1)
        left = await self.snapshot()
        assert not left["meta"], left["meta"]
        for name in ("busy", "keyready", "keyed", "held", "ready", "tagged", "expire", "ack", "waiting"):
            assert not left[name], (name, left[name])

    async def snapshot(self) -> dict[str, object]:
        k = self.keys
        async with self.nodes[0].broker.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k.busy)
            for name in ("keyready", "keyed", "ready", "tagged", "fair"):
                pipe.zrange(getattr(k, name), 0, -1)
            for name in ("held", "expire", "ack", "waiting"):
                pipe.zrange(getattr(k, name), 0, -1)
            pipe.hgetall(k.meta)
            busy, keyready, keyed, ready, tagged, fair, held, expire, ack, waiting, meta = await pipe.execute()
        return {"busy": busy, "keyready": set(keyready), "keyed": set(keyed), "ready": set(ready), "fair": set(fair),
                "tagged": set(tagged), "held": set(held), "expire": set(expire), "ack": set(ack),
                "waiting": set(waiting), "meta": {i: json.loads(raw) for i, raw in meta.items()}}

    # -- steps -----------------------------------------------------------------------------

    @initialize(specs=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-1, 1), st.sampled_from([0, 0, 5, 50]),
                                         st.sampled_from(TAGS), st.sampled_from([30, 100_000]),
                                         st.sampled_from([0, 2])), min_size=1, max_size=8))
    def first_sends(self, specs):
        self.send(specs)

    @rule(specs=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-1, 1), st.sampled_from([0, 0, 5, 50]),
                                   st.sampled_from(TAGS), st.sampled_from([30, 100_000]), st.sampled_from([0, 2])),
                         min_size=1, max_size=5))
    def send(self, specs):
        now = self.clock.now_ms()
        batch = []
        for key, priority, delay_ms, tag, ttl_ms, max_retry in specs:
            msg_id = f"m{len(self.ids):03d}"
            self.ids.append(msg_id)
            batch.append(NewSend(NewMessage(TOPIC, msg_id, "x", now, now + delay_ms, ttl_ms, max_retry, priority,
                                            tag, key, fair_key=("", "A", "B")[len(self.ids) % 3]), False))
        self.run(self.nodes[0].broker.send(batch))

    @rule(node=st.integers(0, 1), batch=st.integers(1, 4), tags=st.sampled_from([(), ("x",), ("x", "y")]),
          push=st.booleans(), gives_back=st.booleans())
    def pull(self, node, batch, tags, push, gives_back):
        answers = iter([False])
        self.run(self.nodes[node].broker.long_poll(
            LongPollRequest(TOPIC, 400, batch, tags, 0, 100 if push else 0),
            (lambda: next(answers, True)) if gives_back else (lambda: False)))

    @rule(data=st.data(), how=st.sampled_from(["ack", "nack", "delete", "release", "retry_at", "reschedule",
                                                "redrive"]))
    def change_one(self, data, how):
        if not self.ids:
            return
        msg_id = data.draw(st.sampled_from(self.ids))
        b = self.nodes[data.draw(st.integers(0, 1))].broker
        now = self.clock.now_ms()
        try:
            if how in ("ack", "nack"):
                self.run(b.ack(AckRequest(TOPIC, msg_id, how == "ack")))
            elif how in ("delete", "release"):
                self.run(b.delete(DeleteRequest(TOPIC, msg_id, how == "release")))
            elif how == "retry_at":
                self.run(b.retry_at(TOPIC, msg_id, now + data.draw(st.sampled_from([0, 20]))))
            elif how == "reschedule":
                self.run(b.reschedule(TOPIC, msg_id, now + data.draw(st.sampled_from([-5, 0, 20]))))
            else:
                self.run(b.redrive(TOPIC, msg_id))
        except (NotFound, Conflict):
            pass

    @rule(key=st.sampled_from(KEYS[:2]), delete=st.booleans(), shift=st.sampled_from([-100, 0, 30]))
    def bulk_by_key(self, key, delete, shift):
        b = self.nodes[0].broker
        if delete:
            self.run(b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(key=key), 100)))
        else:
            flt = BulkFilter(key=key).narrowed(frozenset({Status.WAITING, Status.READY}))
            self.run(b.reschedule_msgs(RescheduleMsgsRequest(TOPIC, flt, 100, shift, None)))

    def flow(self, node: int) -> TopicFlow:
        """The node's keeper of pauses, as broker.node.standalone.RedisNode builds it
        (each change reads the topic again from Redis first)."""
        b = self.nodes[node].broker
        flow = TopicFlow(b.topic_settings, self.clock.now_ms, 10, shared=b.topic_settings)
        flow.start(b)
        return flow

    @rule(node=st.integers(0, 1), key=st.sampled_from(KEYS[:2]), pause=st.booleans(),
          policy=st.sampled_from(list(OnResume)))
    def pause_or_resume_key(self, node, key, pause, policy):
        flow = self.flow(node)
        if pause:
            self.run(flow.pause(PauseRequest(TOPIC, key, policy)))
            self.paused.add(key)
        else:
            self.run(flow.resume(PauseRequest(TOPIC, key, None)))
            self.paused.discard(key)

    @rule(node=st.integers(0, 1), on=st.booleans())
    def fairness(self, node, on):
        self.run(self.flow(node).set_config(TopicConfig(TOPIC, 0, "fairKey" if on else "none", 0, 0)))
        self.fair = on

    @rule(node=st.integers(0, 1), ms=st.sampled_from([1, 5, 30, 100, 400]))
    def advance(self, node, ms):
        self.run(self.nodes[node].advance_to(self.clock.now_ms() + ms))

    @rule(node=st.integers(0, 1))
    def restart(self, node):
        self.run(self.nodes[node].restart())

    # -- the invariant ------------------------------------------------------------------------

    @invariant()
    def structures_agree(self):
        s = self.run(self.snapshot())
        meta: dict[str, dict[str, str]] = s["meta"]
        by_status: dict[str, set[str]] = {}
        for i, m in meta.items():
            by_status.setdefault(m["status"], set()).add(i)
        ready_ids, consuming = by_status.get("2", set()), by_status.get("3", set())
        key = {i: m.get("key", "") for i, m in meta.items()}
        for k, i in s["busy"].items():
            assert i in consuming and key[i] == k, f"busy {k} -> {i}: {meta.get(i)}"
        for i in consuming:
            if key[i]:
                assert s["busy"].get(key[i]) == i, f"{i} consuming, key {key[i]} busy with {s['busy'].get(key[i])}"
        assert s["keyready"] == {f"{key[i]}\0{meta[i]['rk']}" for i in ready_ids if key[i]}
        assert s["expire"] == ready_ids
        assert s["held"] == {i for i in consuming if "node" in meta[i]}
        assert s["ack"] == consuming
        best: dict[str, str] = {}
        for i in ready_ids:
            if key[i] and key[i] not in s["busy"] and key[i] not in self.paused:
                rk = meta[i]["rk"]
                if key[i] not in best or rk.encode() < best[key[i]].encode():
                    best[key[i]] = rk
        pullable = {meta[i]["rk"] for i in ready_ids if not key[i]} | set(best.values())
        assert s["ready"] == pullable, (s["ready"] ^ pullable)
        tag_of_rk = {m["rk"]: m["tag"] for m in meta.values()}
        assert s["tagged"] == {f"{tag_of_rk[rk]},{rk}" for rk in pullable if tag_of_rk[rk]}
        assert s["keyed"] == {f"{key[i]}\0{i}" for i in meta if key[i]}
        fair_of_rk = {m["rk"]: m.get("fairKey", "") for m in meta.values()}
        assert s["fair"] == ({f"{fair_of_rk[rk]}\0{rk}" for rk in pullable} if self.fair else set())


@pytest.mark.slow
def test_the_key_structures_hold_after_every_step(redis_url):
    InvariantMachine.redis_url = redis_url
    runner = InvariantMachine.TestCase()
    runner.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                               suppress_health_check=list(HealthCheck))
    runner.runTest()
