"""Serial keys (docs/api.md, Tags and serial keys) and push hand-back on
the Redis backend, in process over a real redis-server on a FakeClock
(as tests/integration/test_redis_lifecycle.py, whose waiting rules these
follow: every Redis round trip waited for in real time, the fake time
frozen).

- one message of a key is CONSUMING at a time, the next in pull order
  (priority, then trigger time) after its ack, nack, ack timeout, delete,
  push retry or give-back; other keys and unkeyed messages pass a busy
  key; a busy key holds across a restart and between two brokers sharing
  the Redis;
- a hypothesis state machine against an exact model: on Redis a pull
  takes the best READY messages in pull order, a key's best only and one
  of a key, so every pull's answer is predicted;
- a pusher's delivery (LongPollRequest.push_timeout_ms) whose node is
  gone is READY again once its push timeout has passed and the node's
  lease has lapsed, not at its ack deadline; a live node's is not.
"""

from __future__ import annotations

import asyncio
import uuid

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from fakes import FakeClock
from redis_fake_node import FakeClockBroker

from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest
from broker.core.params import AckRequest, DeleteRequest, LongPollRequest, NewSend, PullRequest
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TOPIC = "t"
WAITING, READY, CONSUMING, ACKED, ENDED, DELETED = (Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED,
                                                    Status.ENDED, Status.DELETED)


class Node(FakeClockBroker):
    """One RedisBroker on its FakeClock; nodes made with the same `prefix`
    share the Redis state, as processes sharing one Redis do."""

    def __init__(self, redis_url: str, prefix: str, clock: FakeClock | None = None) -> None:
        super().__init__(redis_url, prefix, clock or FakeClock(START_MS))

    async def send(self, msg_id: str, key: str = "", *, priority: int = 0, delay_ms: int = 0, tag: str = "",
                   ttl_ms: int = MS_PER_HOUR, max_retry: int = 3) -> None:
        now = self.now
        await self.broker.send([NewSend(NewMessage(TOPIC, msg_id, "m", now, now + delay_ms, ttl_ms, max_retry,
                                                   priority, tag, key), False)])

    async def pull(self, batch: int = 10, ack_timeout_ms: int = 30_000, tags: tuple[str, ...] = ()) -> list[str]:
        return [m.msg_id for m in await self.broker.pull(PullRequest(TOPIC, ack_timeout_ms, batch, tags))]

    async def ack(self, msg_id: str, ack: bool = True) -> None:
        await self.broker.ack(AckRequest(TOPIC, msg_id, ack))

    async def state(self, msg_id: str) -> tuple[Status, int]:
        m = await self.broker.get(TOPIC, msg_id)
        return m.status, m.retry


def run(redis_url: str, scenario, nodes: int = 1) -> None:
    async def main():
        prefix = "hg-keys-" + uuid.uuid4().hex[:12]
        clock = FakeClock(START_MS)
        opened = [Node(redis_url, prefix, clock) for _ in range(nodes)]
        for node in opened:
            await node.open()
        try:
            await scenario(*opened)
        finally:
            for node in opened:
                await node.close()
    asyncio.run(main())


def test_one_of_a_key_at_a_time_in_priority_then_trigger_order(redis_url):
    async def scenario(node: Node):
        await node.send("a1", "A")
        await node.send("b1", "B")
        await node.send("n1")
        await node.advance_to(node.now + 1)
        await node.send("a2", "A", priority=5)
        await node.send("a3", "A")
        await node.send("n2")
        assert await node.pull() == ["a2", "b1", "n1", "n2"]  # a2: A's best; then A waits
        assert await node.pull() == []
        assert await node.state("a1") == (READY, 0)
        info = await node.broker.topic_info(TOPIC)
        assert (info["readyQueueSize"], info["ackQueueSize"]) == (2, 4)  # the busy key's ready ones count
        await node.ack("a2")
        assert await node.pull() == ["a1"]  # the earlier trigger time
        await node.ack("a1", ack=False)  # a nack frees the key; a1 is A's best again
        assert await node.pull() == ["a1"]
        await node.ack("a1")
        assert await node.pull() == ["a3"]
        await node.ack("a3")
        assert await node.pull() == []
    run(redis_url, scenario)


def test_the_ack_timeout_frees_the_key(redis_url):
    async def scenario(node: Node):
        await node.send("a1", "A")
        await node.send("a2", "A")
        start = node.now
        assert await node.pull(ack_timeout_ms=100) == ["a1"]
        await node.advance_to(start + 99)
        assert await node.pull() == []
        await node.advance_to(start + 100)
        assert await node.state("a1") == (READY, 1)
        assert await node.pull(batch=1) == ["a1"]  # A's best again (its rank never changes)
        await node.ack("a1")
        assert await node.pull() == ["a2"]
    run(redis_url, scenario)


def test_a_better_message_of_a_free_key_goes_first_and_expiry_gives_way(redis_url):
    async def scenario(node: Node):
        await node.send("a1", "A", ttl_ms=50)
        await node.send("a2", "A")
        await node.send("a3", "A", priority=1, delay_ms=10)
        await node.advance_to(node.now + 10)
        assert await node.pull(batch=1) == ["a3"]  # due later, ranked first
        await node.ack("a3")
        await node.advance_to(node.now + 50)  # a1 expires READY, never delivered: a2 takes its place
        assert await node.state("a1") == (Status.EXPIRED, 0)
        assert await node.pull() == ["a2"]
    run(redis_url, scenario)


def test_tagged_pulls_take_a_free_keys_best_message_when_it_has_the_tag(redis_url):
    async def scenario(node: Node):
        await node.send("a1", "A", tag="x")
        await node.send("a2", "A", tag="y")
        await node.send("b1", "B", tag="y")
        assert await node.pull(tags=("y",)) == ["b1"]  # A's best is a1 (x): a2 waits behind it
        assert await node.pull(tags=("x",)) == ["a1"]
        assert await node.pull(tags=("y",)) == []
        await node.ack("a1")
        assert await node.pull(tags=("x", "y")) == ["a2"]
    run(redis_url, scenario)


def test_delete_retry_at_and_give_back_free_the_key(redis_url):
    async def scenario(node: Node):
        for i in range(1, 5):
            await node.send(f"a{i}", "A")
        assert await node.pull() == ["a1"]
        await node.broker.delete(DeleteRequest(TOPIC, "a1", False))
        assert await node.pull() == ["a2"]
        assert await node.broker.retry_at(TOPIC, "a2", node.now + 1_000) is WAITING  # a failed push
        assert await node.pull() == ["a3"]
        await node.ack("a3")
        answers = iter([False])  # here when the poll starts; gone once it has pulled
        got = await node.broker.long_poll(LongPollRequest(TOPIC, 30_000, 5, (), 1_000), lambda: next(answers, True))
        assert got == []  # pulled a4 and gave it back: the key is free again
        assert await node.state("a4") == (READY, 0)
        assert await node.pull() == ["a4"]
    run(redis_url, scenario)


@pytest.mark.parametrize("frees", ["ack", "delete", "retry_at", "nack_ends_it", "timeout_ends_it", "bulk_delete"])
def test_a_freed_key_wakes_a_long_poll_waiting_for_its_next_message(redis_url, frees):
    """As on disk: a key freed makes its next message pullable, and the
    long polls of the topic hear of it at once (not at their next repoll)."""
    async def scenario(node: Node):
        await node.send("a1", "A", max_retry=0 if frees.endswith("ends_it") else 3)
        await node.send("a2", "A")
        assert await node.pull(ack_timeout_ms=100) == ["a1"]
        script, pulls = node.broker._link.scripts["pull"], []

        async def pull(keys, args):
            result = await script(keys=keys, args=args)
            pulls.append(result)
            return result
        node.broker._link.scripts["pull"] = pull
        poll = asyncio.ensure_future(node.broker.long_poll(LongPollRequest(TOPIC, 30_000, 5, (), 5_000)))
        await node.until(lambda: pulls, "the long poll's first pull")  # found nothing: it waits
        assert not poll.done()
        if frees == "ack":
            await node.ack("a1")
        elif frees == "delete":
            await node.broker.delete(DeleteRequest(TOPIC, "a1", False))
        elif frees == "retry_at":
            assert await node.broker.retry_at(TOPIC, "a1", node.now + 60_000) is WAITING
        elif frees == "nack_ends_it":
            await node.ack("a1", ack=False)
        elif frees == "timeout_ends_it":
            await node.advance_to(node.now + 100)  # before the poll's repoll (poll_ms)
        else:
            assert await node.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(msg_id_prefix="a1"), 10)) \
                == (1, False)
        await node.until(poll.done, f"the long poll woken by the {frees} that freed the key")
        assert [m.msg_id for m in poll.result()] == ["a2"]
    run(redis_url, scenario)


def test_a_busy_key_holds_across_a_restart_and_between_two_brokers(redis_url):
    async def scenario(one: Node, two: Node):
        for i in range(1, 4):
            await one.send(f"a{i}", "A")
        await one.send("b1", "B")
        assert await one.pull(batch=1) == ["a1"]
        assert await two.pull() == ["b1"]  # the other broker passes over A
        await one.restart()
        assert await one.pull() == [] and await two.pull() == []
        await two.ack("a1")  # acked through the other broker
        assert await one.pull() == ["a2"]
        assert await two.pull() == []
        await one.ack("b1")
        await one.ack("a2", ack=False)
        assert await two.pull() == ["a2"]
    run(redis_url, scenario, nodes=2)


def test_bulk_calls_by_key(redis_url):
    async def scenario(node: Node):
        for i in range(6):
            await node.send(f"m{i}", "order-42" if i % 2 else "order-7", delay_ms=0 if i < 4 else MS_PER_HOUR)
        assert await node.pull() == ["m0", "m1"]
        page, cursor = await node.broker.list_msgs(ListMsgRequest(TOPIC, BulkFilter(key="order-42"), None, 100, False))
        assert sorted(m.msg_id for m in page) == ["m1", "m3", "m5"] and cursor is None
        assert {m.key for m in page} == {"order-42"}
        deleted, more = await node.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(key="order-42"), 100))
        assert (deleted, more) == (3, False)
        assert [(await node.state(f"m{i}"))[0] for i in range(6)] == [CONSUMING, DELETED, READY, DELETED, WAITING,
                                                                      DELETED]
        assert await node.pull() == []  # order-7 is busy with m0
        await node.ack("m0")
        assert await node.pull() == ["m2"]
    run(redis_url, scenario)


def test_a_gone_nodes_push_deliveries_are_ready_once_their_push_timeout_passed_and_its_lease_lapsed(redis_url):
    async def scenario(pusher: Node, other: Node):
        lease_ms = other.config.lease_ms
        await pusher.send("gone", "A")
        start = pusher.now
        push = LongPollRequest(TOPIC, 70_000, 5, (), 1_000, push_timeout_ms=5_000)
        assert [m.msg_id for m in await pusher.broker.long_poll(push)] == ["gone"]
        await pusher.advance_to(start + 5_000)  # the pusher ticks: its lease holds
        await pusher.send("later", "B")
        longer = push._replace(push_timeout_ms=30_000)
        assert [m.msg_id for m in await pusher.broker.long_poll(longer)] == ["later"]
        await pusher.close()  # the node is gone: no more leases from it
        await other.advance_to(start + 5_000 + lease_ms - 1)
        assert await other.state("gone") == (CONSUMING, 1)
        await other.advance_to(start + 5_000 + lease_ms)  # past its push timeout, and the lease lapsed
        assert await other.state("gone") == (READY, 1)
        assert await other.state("later") == (CONSUMING, 1)  # its push timeout has not passed
        assert await other.pull() == ["gone"]  # and the key A is free
        await other.advance_to(start + 35_000 - 1)
        assert await other.state("later") == (CONSUMING, 1)
        await other.advance_to(start + 35_000)
        assert await other.state("later") == (READY, 1)
        pusher.broker = None
    run_with_one_closed(redis_url, scenario)


def run_with_one_closed(redis_url: str, scenario) -> None:
    async def main():
        prefix = "hg-keys-" + uuid.uuid4().hex[:12]
        clock = FakeClock(START_MS)
        one, two = Node(redis_url, prefix, clock), Node(redis_url, prefix, clock)
        await one.open()
        await two.open()
        try:
            await scenario(one, two)
        finally:
            await two.close()
            if one.broker is not None:
                await one.close()
    asyncio.run(main())


def test_a_live_nodes_push_delivery_waits_for_its_ack_deadline(redis_url):
    async def scenario(node: Node):
        await node.send("slow")
        start = node.now
        push = LongPollRequest(TOPIC, 70_000, 5, (), 1_000, push_timeout_ms=5_000)
        assert [m.msg_id for m in await node.broker.long_poll(push)] == ["slow"]
        for at in (5_000, 5_000 + node.config.lease_ms, 69_999):
            await node.advance_to(start + at)
            assert await node.state("slow") == (CONSUMING, 1)
        await node.advance_to(start + 70_000)
        assert await node.state("slow") == (READY, 1)
    run(redis_url, scenario)


# -- against a model --------------------------------------------------------------------------

KEYS = ("k1", "k2", "k3", "")
ACK_TIMEOUT_MS = 1_000


class Model:
    """What the Redis backend must answer: READY messages in pull order
    (-priority, trigger, msgId), one of a key at a time, a busy key's
    passed over."""

    def __init__(self) -> None:
        self.key: dict[str, str] = {}
        self.rank: dict[str, tuple[int, int, str]] = {}
        self.status: dict[str, Status] = {}
        self.retry: dict[str, int] = {}
        self.deadline: dict[str, int] = {}
        self.max_retry: dict[str, int] = {}

    def busy(self) -> set[str]:
        return {self.key[i] for i, s in self.status.items() if s is CONSUMING and self.key[i]}

    def pull(self, batch: int, now_ms: int) -> list[str]:
        busy, out = self.busy(), []
        for msg_id in sorted((i for i, s in self.status.items() if s is READY), key=self.rank.__getitem__):
            if len(out) == batch:
                break
            k = self.key[msg_id]
            if k and k in busy:
                continue
            busy.add(k)
            out.append(msg_id)
            self.status[msg_id] = CONSUMING
            self.retry[msg_id] += 1
            self.deadline[msg_id] = now_ms + ACK_TIMEOUT_MS
        return out

    def not_acked(self, msg_id: str) -> None:
        self.status[msg_id] = ENDED if self.retry[msg_id] > self.max_retry[msg_id] else READY


class RedisKeyMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.node = Node(self.redis_url, "hg-keys-model-" + uuid.uuid4().hex[:12])
        self.loop.run_until_complete(self.node.open())
        self.model = Model()
        self.sent = 0

    def teardown(self) -> None:
        self.loop.run_until_complete(self.node.close())
        self.loop.close()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    @rule(specs=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(-2, 2), st.sampled_from([0, 0, 5]),
                                   st.sampled_from([0, 3])), min_size=1, max_size=6))
    def send(self, specs):
        now = self.node.now
        batch = []
        for key, priority, delay_ms, max_retry in specs:
            msg_id = f"m{self.sent:03d}"
            self.sent += 1
            batch.append(NewSend(NewMessage(TOPIC, msg_id, "x", now, now + delay_ms, 24 * MS_PER_HOUR, max_retry,
                                            priority, "", key), False))
            m = self.model
            m.key[msg_id], m.rank[msg_id] = key, (-priority, now + delay_ms, msg_id)
            m.status[msg_id] = WAITING if delay_ms else READY
            m.retry[msg_id], m.max_retry[msg_id] = 0, max_retry
        self.run(self.node.broker.send(batch))

    @rule(batch=st.integers(1, 5))
    def pull(self, batch):
        got = self.run(self.node.pull(batch, ACK_TIMEOUT_MS))
        assert got == self.model.pull(batch, self.node.now)

    @rule(data=st.data(), ack=st.booleans())
    def ack_one(self, data, ack):
        consuming = sorted(i for i, s in self.model.status.items() if s is CONSUMING)
        if not consuming:
            return
        msg_id = data.draw(st.sampled_from(consuming))
        self.run(self.node.ack(msg_id, ack))
        if ack:
            self.model.status[msg_id] = ACKED
        else:
            self.model.not_acked(msg_id)

    @precondition(lambda self: self.sent > 0)  # the mover ticks only topics sent to
    @rule(ms=st.sampled_from([1, 5, ACK_TIMEOUT_MS]))
    def advance(self, ms):
        target = self.node.now + ms
        self.run(self.node.advance_to(target))
        m = self.model
        for msg_id, s in list(m.status.items()):
            if s is WAITING and m.rank[msg_id][1] <= target:
                m.status[msg_id] = READY
            elif s is CONSUMING and m.deadline[msg_id] <= target:
                m.not_acked(msg_id)

    @rule()
    def restart(self):
        self.run(self.node.restart())

    @invariant()
    def statuses_agree(self):
        if self.sent:
            for msg_id, s in self.model.status.items():
                assert self.run(self.node.state(msg_id)) == (s, self.model.retry[msg_id]), msg_id


@pytest.mark.slow
def test_serial_keys_against_the_model(redis_url):
    RedisKeyMachine.redis_url = redis_url
    runner = RedisKeyMachine.TestCase()
    runner.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                               suppress_health_check=list(HealthCheck))
    runner.runTest()


def test_the_tick_of_an_idle_topic_writes_nothing(redis_url):
    """Leases are renewed only where push deliveries are held: a TICK that
    moves nothing changes nothing in Redis (nothing for an AOF or a
    replica to carry)."""
    async def scenario(node: Node):
        await node.send("later", "A", delay_ms=MS_PER_HOUR)
        await node.advance_to(node.now + 1)

        async def changes() -> int:  # (a key of an earlier test on this server expiring is one change too)
            redis = node.broker.redis
            return (int((await redis.info("persistence"))["rdb_changes_since_last_save"])
                    - int((await redis.info("stats"))["expired_keys"]))
        before = await changes()
        for step in range(2, 6):
            await node.advance_to(node.now + step)
        assert await changes() == before
    run(redis_url, scenario)
