"""The Redis backend's lifecycle on a FakeClock: broker.redis.backend.
RedisBroker in process over a real redis-server (the session's; each test
keys under a prefix of its own), driven by fake time, so each change is
checked at the millisecond before it and at it, as the disk broker's are in
tests/unit/test_broker_lifecycle.py.

The broker passes clock.now_ms() into its Lua scripts and its mover and
long polls wait on the clock, but every Redis call is real I/O: the clock's
settle() may return while one is in flight. So `advance_to` sets the fake
time, wakes the mover and then waits, in real time with the fake time
frozen, until the mover's TICK at that time has come back from Redis;
everything else that must show (a long poll answered, one parked again)
is waited for the same way (`until`), never by a fixed sleep.

These are the Redis twins of the conformance tests marked
`redis_on_fake_clock` (tests/conformance/conftest.py), which then run as
processes on the other backends only.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from fakes import FakeClock
from redis_fake_node import FakeClockBroker

from broker.core.params import AckRequest, LongPollRequest, NewSend, PullRequest
from storage.entry import MS_PER_HOUR, Message, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TOPIC = "t"
WAITING, READY, CONSUMING, ACKED, ENDED = Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED, Status.ENDED


class Node(FakeClockBroker):
    """One RedisBroker on a FakeClock, with the calls a test makes."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url, "hg-fake-" + uuid.uuid4().hex[:12], FakeClock(START_MS))

    async def send(self, msg_id: str, *, delay_ms: int = 0, ttl_ms: int = MS_PER_HOUR, max_retry: int = 3) -> Message:
        now = self.now
        sent, = await self.broker.send([NewSend(NewMessage(TOPIC, msg_id, "m", now, now + delay_ms, ttl_ms, max_retry,
                                                           0, ""), False)])
        return sent

    async def pulled_ids(self, ack_timeout_ms: int = 30_000) -> list[str]:
        return [m.msg_id for m in await self.broker.pull(PullRequest(TOPIC, ack_timeout_ms, 10, ()))]

    async def ack(self, msg_id: str, ack: bool = True) -> None:
        await self.broker.ack(AckRequest(TOPIC, msg_id, ack))

    async def state(self, msg_id: str) -> tuple[Status, int]:
        m = await self.broker.get(TOPIC, msg_id)
        return m.status, m.retry

    async def info(self) -> tuple[int, int, int]:
        data = await self.broker.topic_info(TOPIC)
        return data["waitingQueueSize"], data["readyQueueSize"], data["ackQueueSize"]

    async def long_poll(self, timeout_ms: int) -> asyncio.Task:
        """Start a long poll; returns once it has begun (its deadline read)."""
        task = asyncio.create_task(self.broker.long_poll(LongPollRequest(TOPIC, 30_000, 5, (), timeout_ms)))
        await self.clock.settle()
        return task


def run(redis_url: str, scenario) -> None:
    async def main():
        node = Node(redis_url)
        await node.open()
        try:
            await scenario(node)
        finally:
            await node.close()
    asyncio.run(main())


# -- ack timeouts ---------------------------------------------------------------------


def test_an_ack_after_the_timeout_redelivery_still_acks(redis_url):
    async def scenario(node: Node):
        await node.send("late", max_retry=3)
        assert await node.pulled_ids(ack_timeout_ms=100) == ["late"]
        await node.advance_to(START_MS + 99)
        assert await node.state("late") == (CONSUMING, 1)
        await node.advance_to(START_MS + 100)
        assert await node.state("late") == (READY, 1)
        await node.ack("late")  # acking a ready message acks it
        assert await node.state("late") == (ACKED, 1)
    run(redis_url, scenario)


# -- ttl ---------------------------------------------------------------------------------


def test_ttl_after_a_delivery_ends_as_6(redis_url):
    async def scenario(node: Node):
        sent = await node.send("e6", ttl_ms=300, max_retry=5)
        assert await node.pulled_ids(ack_timeout_ms=60_000) == ["e6"]
        await node.ack("e6", ack=False)  # ready again, delivered once
        await node.advance_to(sent.expire_ms - 1)
        assert await node.state("e6") == (READY, 1)
        await node.advance_to(sent.expire_ms)
        assert await node.state("e6") == (ENDED, 1)
        assert await node.pulled_ids() == []
    run(redis_url, scenario)


def test_a_consuming_message_past_its_ttl_ends_at_its_ack_timeout(redis_url):
    async def scenario(node: Node):
        sent = await node.send("c", ttl_ms=500, max_retry=5)
        assert await node.pulled_ids(ack_timeout_ms=2_000) == ["c"]
        await node.advance_to(sent.expire_ms + 100)  # past expireTime, within the ack timeout: left to its consumer
        assert await node.state("c") == (CONSUMING, 1)
        await node.advance_to(START_MS + 2_000 - 1)
        assert await node.state("c") == (CONSUMING, 1)
        await node.advance_to(START_MS + 2_000)
        assert await node.state("c") == (ENDED, 1)
        assert await node.pulled_ids() == []
    run(redis_url, scenario)


# -- lateness -------------------------------------------------------------------------------


def test_a_trigger_time_long_past_counts_late_from_its_arrival_not_from_1970(redis_url):
    """As the disk broker's (tests/unit/test_broker_lifecycle.py): a send
    with triggerTime=1000, and a reschedule to it, are due when they arrive."""
    async def scenario(node: Node):
        await node.send("w", delay_ms=600_000, ttl_ms=START_MS + MS_PER_HOUR)
        sent, = await node.broker.send([NewSend(NewMessage(TOPIC, "t1000", "m", node.now, 1_000,
                                                           START_MS + MS_PER_HOUR, 3, 0, ""), False)])
        assert sent.status is READY
        await node.advance_to(START_MS + 1_000)
        assert (await node.broker.reschedule(TOPIC, "w", 1_000)).status is READY
        lateness = node.broker.metrics.load_lateness_seconds
        assert lateness.count == 2 and lateness.total < 1, (lateness.count, lateness.total)
        m = node.broker.metrics.topic(TOPIC)
        assert m.ready_gap.count == 2 and m.ready_gap.max < 1_000
        assert sorted(await node.pulled_ids()) == ["t1000", "w"]
        assert m.pull_gap.max <= 1_000
    run(redis_url, scenario)


# -- reschedule ----------------------------------------------------------------------------


def test_a_waiting_message_moved_later_is_not_delivered_at_the_old_time_nor_before_the_new(redis_url):
    async def scenario(node: Node):
        sent = await node.send("w", delay_ms=300)
        moved = await node.broker.reschedule(TOPIC, "w", START_MS + 1_500)
        assert (moved.status, moved.trigger_ms, moved.retry) == (WAITING, START_MS + 1_500, 0)
        await node.advance_to(sent.trigger_ms + 300)  # past the old trigger time
        assert await node.pulled_ids() == [] and await node.state("w") == (WAITING, 0)
        await node.advance_to(moved.trigger_ms - 1)
        assert await node.pulled_ids() == []
        await node.advance_to(moved.trigger_ms)
        assert await node.pulled_ids() == ["w"]
        assert (await node.broker.get(TOPIC, "w")).trigger_ms == moved.trigger_ms
    run(redis_url, scenario)


def test_a_ready_message_moved_later_leaves_the_ready_queue(redis_url):
    async def scenario(node: Node):
        await node.send("r")
        assert await node.state("r") == (READY, 0)
        moved = await node.broker.reschedule(TOPIC, "r", START_MS + 800)
        assert moved.status is WAITING
        assert await node.pulled_ids() == [] and await node.info() == (1, 0, 0)
        await node.advance_to(moved.trigger_ms - 1)
        assert await node.pulled_ids() == []
        await node.advance_to(moved.trigger_ms)
        assert await node.pulled_ids() == ["r"]
    run(redis_url, scenario)


# -- restart ------------------------------------------------------------------------------------


def test_a_message_consuming_across_a_restart_is_ready_again_at_its_ack_deadline(redis_url):
    async def scenario(node: Node):
        await node.send("c", max_retry=3)
        assert await node.pulled_ids(ack_timeout_ms=500) == ["c"]
        await node.restart()
        await node.advance_to(START_MS + 499)
        assert await node.state("c") == (CONSUMING, 1)  # its pull's deadline, kept
        await node.advance_to(START_MS + 500)
        assert await node.state("c") == (READY, 1)  # timed out as set: ready again (delivered once)
        assert await node.pulled_ids(ack_timeout_ms=500) == ["c"]
    run(redis_url, scenario)


# -- long polls ---------------------------------------------------------------------------------


def test_a_long_poll_answers_empty_at_its_timeout_and_not_before(redis_url):
    async def scenario(node: Node):
        await node.send("far", delay_ms=MS_PER_HOUR)  # (the mover ticks only topics sent to)
        task = await node.long_poll(timeout_ms=2_500)  # re-pulls every poll_ms (1 s) meanwhile
        deadline = START_MS + 2_500
        await node.advance_to(deadline - 1)
        await node.until(lambda: task.done() or node.clock.next_deadline_ms() == deadline, "the poll parked again")
        assert not task.done()
        await node.advance_to(deadline)
        await node.until(task.done, "the poll answered")
        assert task.result() == [] and node.now == deadline
    run(redis_url, scenario)


def test_a_long_poll_is_answered_at_once_by_a_release_before_its_timeout(redis_url):
    async def scenario(node: Node):
        sent = await node.send("soon", delay_ms=700)
        task = await node.long_poll(timeout_ms=2_500)
        await node.advance_to(sent.trigger_ms - 1)
        assert not task.done()
        await node.advance_to(sent.trigger_ms)
        await node.until(task.done, "the poll answered")
        assert [m.msg_id for m in task.result()] == ["soon"] and node.now == sent.trigger_ms
        assert await node.state("soon") == (CONSUMING, 1)
    run(redis_url, scenario)


# -- a schedule's run with misfire=skip ---------------------------------------------------------


def test_a_skip_run_released_past_its_deadline_ends_unseen_and_one_released_within_is_delivered(redis_url):
    """NewSend.skip_after_ms (broker.schedules.keeper sends it for a run of
    misfire=skip: nominal + grace): the TICK that releases the run after
    it ends it unseen (5, retry 0), as the disk's on_release does; at it,
    the run is delivered, and once released it skips nothing again (a
    reschedule's later release delivers it)."""
    async def scenario(node: Node):
        now = node.now

        def skip_run(msg_id: str, delay_ms: int, skip_after_ms: int) -> NewSend:
            return NewSend(NewMessage(TOPIC, msg_id, "m", now, now + delay_ms, MS_PER_HOUR, 3, 0, ""), True,
                           skip_after_ms)
        late, on_time, due_late = await node.broker.send([
            skip_run("late", 600, now + 500), skip_run("on-time", 300, now + 300), skip_run("due-late", -100, now - 1)])
        assert (late.status, on_time.status) == (WAITING, WAITING)
        assert due_late.status is Status.EXPIRED  # sent due and past its deadline: ended as it is stored
        await node.advance_to(now + 300)  # at the deadline: released
        assert await node.state("on-time") == (READY, 0)
        await node.advance_to(now + 599)
        assert await node.state("late") == (WAITING, 0)
        await node.advance_to(now + 600)  # past its deadline: ended unseen in its release
        assert await node.state("late") == (Status.EXPIRED, 0)
        assert await node.info() == (0, 1, 0)
        pending = (await node.broker.send([skip_run("pending", 5_000, now + 500)]))[0]
        assert pending.status is WAITING
        moved = await node.broker.reschedule(TOPIC, "pending", now)  # never released, moved past its deadline
        assert (moved.status, moved.retry) == (Status.EXPIRED, 0)
        moved = await node.broker.reschedule(TOPIC, "on-time", now + 2_000)  # past the deadline, released before
        assert (moved.status, moved.retry) == (WAITING, 0)
        await node.advance_to(now + 2_000)
        assert await node.state("on-time") == (READY, 0)
        assert await node.pulled_ids() == ["on-time"]
        assert node.broker.metrics.topic(TOPIC).ended == 3
    run(redis_url, scenario)
