"""Leases (docs/api.md, "Leases") on the Redis backend, in process over a
real redis-server on a FakeClock (as tests/integration/test_redis_lifecycle.py,
whose waiting rules these follow), as tests/unit/test_broker_leases.py
checks them on the disk broker:

- a pull's messages share its delivery, which getMsg does not show; an
  extension moves the ack timeout to its new deadline (later or sooner),
  its retry not counted again; the lease's bound;
- a stale delivery (an earlier hand-over's, a made-up one, a message not
  consuming or no message) is refused and changes nothing; the current
  holder's ack or nack does what an ordinary one does: counted, a nack
  after the last delivery ends the message, a serial key freed wakes a
  long poll of the topic;
- a repeated id is judged once, by its first delivery;
- the delivery survives a restart of the broker, and a message pulled
  before leases (no delivery in its meta) is fenced by none.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from fakes import FakeClock
from redis_fake_node import FakeClockBroker

from broker.core.leases import new_delivery
from broker.core.params import AckRequest, Fenced, FencedRequest, LongPollRequest, NewSend, PullRequest
from broker.core.transitions import Fencing, Refusal
from storage.entry import MS_PER_HOUR, Message, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TOPIC = "t"
ACK_TIMEOUT_MS = 30_000
LEASE_MS = 12 * MS_PER_HOUR
WAITING, READY, CONSUMING, ACKED, ENDED = Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED, Status.ENDED
ACK, NACK, EXTEND = Fenced.ACK, Fenced.NACK, Fenced.EXTEND
STALE, LEASE_CAP = Refusal.STALE, Refusal.LEASE_CAP


class Node(FakeClockBroker):
    """One RedisBroker on a FakeClock, with the calls a test makes."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url, "hg-leases-" + uuid.uuid4().hex[:12], FakeClock(START_MS))

    async def send(self, msg_id: str, key: str = "", *, delay_ms: int = 0, max_retry: int = 3) -> None:
        now = self.now
        await self.broker.send([NewSend(NewMessage(TOPIC, msg_id, "m", now, now + delay_ms, 24 * MS_PER_HOUR,
                                                   max_retry, 0, "", key), False)])

    async def pull(self, ack_timeout_ms: int = ACK_TIMEOUT_MS, batch: int = 10) -> list[Message]:
        return await self.broker.pull(PullRequest(TOPIC, ack_timeout_ms, batch, ()))

    async def fenced(self, kind: Fenced, msg_ids: tuple[str, ...], deliveries: tuple[int, ...],
                     ack_timeout_ms: int = ACK_TIMEOUT_MS, max_lease_ms: int = LEASE_MS) -> list[Fencing]:
        return await self.broker.fenced(FencedRequest(TOPIC, msg_ids, deliveries, kind, len(msg_ids) > 1,
                                                      ack_timeout_ms, max_lease_ms))

    async def state(self, msg_id: str) -> tuple[Status, int]:
        m = await self.broker.get(TOPIC, msg_id)
        return m.status, m.retry

    def counts(self) -> tuple[int, int, int, int, int, int]:
        m = self.broker.metrics.topic(TOPIC)
        return m.acks, m.nacks, m.retries, m.ended, m.extensions, m.stale


def run(redis_url: str, scenario) -> None:
    async def main():
        node = Node(redis_url)
        await node.open()
        try:
            await scenario(node)
        finally:
            await node.close()
    asyncio.run(main())


def test_a_pulls_messages_share_its_delivery_and_get_msg_shows_none(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        await node.send("b")
        got = await node.pull()
        assert [m.msg_id for m in got] == ["a", "b"]
        assert got[0].delivery and got[0].delivery == got[1].delivery
        assert (await node.broker.get(TOPIC, "a")).delivery == 0  # a hand-over's, not the message's
        await node.advance_to(START_MS + ACK_TIMEOUT_MS)
        again = await node.pull(batch=1)
        assert again[0].retry == 2 and again[0].delivery not in (0, got[0].delivery)
    run(redis_url, scenario)


def test_an_extension_moves_the_ack_timeout_and_counts_no_retry(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        (got,) = await node.pull(ack_timeout_ms=1_000)
        await node.advance_to(START_MS + 500)
        assert await node.fenced(EXTEND, ("a",), (got.delivery,), ack_timeout_ms=2_000) == [
            Fencing(CONSUMING, None, START_MS + 2_500)]
        await node.advance_to(START_MS + 1_000)  # its first deadline: held still
        assert await node.state("a") == (CONSUMING, 1) and await node.pull() == []
        await node.advance_to(START_MS + 2_499)
        assert await node.state("a") == (CONSUMING, 1)
        await node.advance_to(START_MS + 2_500)  # the extended one: timed out, as a nack
        assert await node.state("a") == (READY, 1)
        assert node.counts()[4:] == (1, 0)
        (again,) = await node.pull()
        assert again.retry == 2 and again.delivery != got.delivery
    run(redis_url, scenario)


def test_an_extension_may_shorten_the_lease(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        (got,) = await node.pull(ack_timeout_ms=60_000)
        assert await node.fenced(EXTEND, ("a",), (got.delivery,), ack_timeout_ms=100) == [
            Fencing(CONSUMING, None, START_MS + 100)]
        await node.advance_to(START_MS + 99)
        assert await node.state("a") == (CONSUMING, 1)
        await node.advance_to(START_MS + 100)
        assert await node.state("a") == (READY, 1)
    run(redis_url, scenario)


def test_an_extension_past_the_lease_bound_is_refused_and_changes_nothing(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        (got,) = await node.pull(ack_timeout_ms=5_000)
        await node.advance_to(START_MS + 5_000 - 1)
        assert await node.fenced(EXTEND, ("a",), (got.delivery,), ack_timeout_ms=5_001, max_lease_ms=10_000) == [
            Fencing(CONSUMING, None, START_MS + 10_000)]  # exactly the bound: allowed
        await node.advance_to(START_MS + 5_000)
        assert await node.fenced(EXTEND, ("a",), (got.delivery,), ack_timeout_ms=5_001, max_lease_ms=10_000) == [
            Fencing(CONSUMING, LEASE_CAP, 0)]
        assert node.counts()[4:] == (1, 0)  # a capped extension is not stale
        await node.advance_to(START_MS + 10_000 - 1)
        assert await node.state("a") == (CONSUMING, 1)
        await node.advance_to(START_MS + 10_000)  # the deadline the refused one left as it was
        assert await node.state("a") == (READY, 1)
    run(redis_url, scenario)


def test_a_stale_delivery_is_refused_and_the_current_holder_goes_on(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        (first,) = await node.pull(ack_timeout_ms=1_000)
        await node.advance_to(START_MS + 1_000)
        (second,) = await node.pull()
        for kind in (ACK, NACK, EXTEND):
            assert await node.fenced(kind, ("a",), (first.delivery,)) == [Fencing(CONSUMING, STALE, 0)]
            assert await node.fenced(kind, ("a",), (new_delivery(node.now),)) == [Fencing(CONSUMING, STALE, 0)]
            assert await node.state("a") == (CONSUMING, 2)
        assert node.counts() == (0, 0, 1, 0, 0, 6)  # (the one retry: its ack timeout)
        assert await node.fenced(ACK, ("a",), (second.delivery,)) == [Fencing(ACKED, None, 0)]
        assert await node.state("a") == (ACKED, 2)
        # a retried ack: no delivery is current any more
        assert await node.fenced(ACK, ("a",), (second.delivery,)) == [Fencing(ACKED, STALE, 0)]
        assert node.counts() == (1, 0, 1, 0, 0, 7)
    run(redis_url, scenario)


def test_a_message_not_consuming_or_none_is_fenced_by_no_delivery(redis_url):
    async def scenario(node: Node):
        await node.send("w", delay_ms=60_000)
        await node.send("r")
        delivery = new_delivery(node.now)
        for kind in (ACK, NACK, EXTEND):
            assert await node.fenced(kind, ("w", "r", "nope"), (delivery,) * 3) == [
                Fencing(WAITING, STALE, 0), Fencing(READY, STALE, 0), Fencing(None, STALE, 0)]
        assert await node.state("w") == (WAITING, 0) and await node.state("r") == (READY, 0)
    run(redis_url, scenario)


def test_the_holders_nack_requeues_and_after_its_last_delivery_ends_it(redis_url):
    async def scenario(node: Node):
        await node.send("a", max_retry=1)
        (got,) = await node.pull()
        assert await node.fenced(NACK, ("a",), (got.delivery,)) == [Fencing(READY, None, 0)]
        (again,) = await node.pull()
        assert again.retry == 2
        assert await node.fenced(NACK, ("a",), (got.delivery,)) == [Fencing(CONSUMING, STALE, 0)]
        assert await node.fenced(NACK, ("a",), (again.delivery,)) == [Fencing(ENDED, None, 0)]
        assert await node.state("a") == (ENDED, 2)
        assert node.counts() == (0, 2, 1, 1, 0, 1)
    run(redis_url, scenario)


def test_many_ids_each_answered_alone_a_repeated_one_by_its_first_delivery(redis_url):
    async def scenario(node: Node):
        for msg_id in "abc":
            await node.send(msg_id)
        got = {m.msg_id: m.delivery for m in await node.pull()}
        outcomes = await node.fenced(EXTEND, ("a", "b", "c", "nope", "a"),
                                     (got["a"], got["b"] + 1, got["c"], got["a"], got["b"] + 1))
        deadline = START_MS + ACK_TIMEOUT_MS
        assert outcomes == [Fencing(CONSUMING, None, deadline), Fencing(CONSUMING, STALE, 0),
                            Fencing(CONSUMING, None, deadline), Fencing(None, STALE, 0),
                            Fencing(CONSUMING, None, deadline)]
        assert node.counts()[4:] == (2, 2)
        outcomes = await node.fenced(ACK, ("b", "a", "b"), (got["b"], got["a"] + 1, got["b"] + 1))
        assert outcomes == [Fencing(ACKED, None, 0), Fencing(CONSUMING, STALE, 0), Fencing(ACKED, None, 0)]
        assert [await node.state(i) for i in "abc"] == [(CONSUMING, 1), (ACKED, 1), (CONSUMING, 1)]
    run(redis_url, scenario)


@pytest.mark.parametrize("kind", [ACK, NACK])
def test_the_holders_ack_or_nack_frees_its_key_and_wakes_a_long_poll(redis_url, kind):
    async def scenario(node: Node):
        await node.send("a1", "A")
        await node.send("a2", "A")
        (got,) = await node.pull()
        script, pulls = node.broker._link.scripts["pull"], []

        async def pull(keys, args):
            result = await script(keys=keys, args=args)
            pulls.append(result)
            return result
        node.broker._link.scripts["pull"] = pull
        poll = asyncio.ensure_future(node.broker.long_poll(LongPollRequest(TOPIC, 30_000, 5, (), 5_000)))
        await node.until(lambda: pulls, "the long poll's first pull")  # A is busy: it waits
        assert not poll.done()
        (outcome,) = await node.fenced(kind, ("a1",), (got.delivery,))
        assert outcome == Fencing(ACKED if kind is ACK else READY, None, 0)
        await node.until(poll.done, "the long poll woken by the fenced call that freed the key")
        (polled,) = poll.result()
        assert polled.msg_id == ("a2" if kind is ACK else "a1") and polled.delivery != got.delivery
    run(redis_url, scenario)


def test_the_holders_delivery_survives_a_restart(redis_url):
    async def scenario(node: Node):
        await node.send("a")
        (got,) = await node.pull()
        await node.advance_to(START_MS + 20_000)
        await node.fenced(EXTEND, ("a",), (got.delivery,), ack_timeout_ms=25_000)
        await node.restart()
        assert await node.fenced(EXTEND, ("a",), (new_delivery(node.now),)) == [Fencing(CONSUMING, STALE, 0)]
        await node.advance_to(START_MS + 45_000 - 1)  # the extended deadline kept
        assert await node.state("a") == (CONSUMING, 1)
        assert await node.fenced(ACK, ("a",), (got.delivery,)) == [Fencing(ACKED, None, 0)]
    run(redis_url, scenario)


def test_a_message_pulled_before_leases_is_fenced_by_no_delivery_and_acked_by_msg_id(redis_url):
    async def scenario(node: Node):
        await node.send("old")
        (got,) = await node.pull()
        meta = node.broker._link.keys(TOPIC).meta
        m = json.loads(await node.broker.redis.hget(meta, "old"))
        del m["delivery"]  # as the version before leases stored it
        await node.broker.redis.hset(meta, "old", json.dumps(m))
        for kind in (ACK, NACK, EXTEND):
            assert await node.fenced(kind, ("old",), (got.delivery,)) == [Fencing(CONSUMING, STALE, 0)]
        assert await node.state("old") == (CONSUMING, 1)
        await node.broker.ack(AckRequest(TOPIC, "old", True))  # camellia's ack by msgId, as before
        assert await node.state("old") == (ACKED, 1)
    run(redis_url, scenario)
