"""broker.disk.ready.TopicQueue's pull order -- `ready` and its three heaps with
stale entries -- against a sorted list: messages enter and leave the order
(as the ready windows move them), pulls take the best (by tags, one of a
serial key at most) and a full window asks for its last. After every step
the heaps hold no more than `entries`, which stays bounded by the window."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.transitions import MessageState
from broker.disk.ready import ORDER_SLACK, HeldMessage, TopicQueue
from storage.entry import Location, Status

TAGS = ("", "a", "b")  # ("": untagged; a pull's filter never holds it: broker.core.params drops empty tags)
KEYS = ("", "", "k1", "k2")


def held(n: int, priority: int, trigger_ms: int, tag: str, serial_key: str) -> HeldMessage:
    location = Location(7 + n % 2, n)
    return HeldMessage(location, "t", tag, f"m{n}", 1, serial_key, (-priority, trigger_ms, location),
                       MessageState(Status.READY, 0, 3, trigger_ms, 60_000))


class OrderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = TopicQueue("t", 1)
        self.model: dict[Location, HeldMessage] = {}  # what the order holds
        self.made = 0

    @rule(priority=st.integers(-1, 1), trigger_ms=st.integers(0, 3), tag=st.sampled_from(TAGS),
          serial_key=st.sampled_from(KEYS))
    def enter(self, priority, trigger_ms, tag, serial_key):
        h = held(self.made, priority, trigger_ms, tag, serial_key)
        self.made += 1
        self.queue.order(h)
        self.model[h.location] = h

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave(self, data):
        """An ack by id, a delete, an expiry, a park: out of the order."""
        h = data.draw(st.sampled_from(sorted(self.model.values(), key=lambda h: h.key)))
        self.queue.unorder(h)
        del self.model[h.location]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave_and_come_back(self, data):
        """A nack: out of the order, then in again (its old entries are its key's)."""
        h = data.draw(st.sampled_from(sorted(self.model.values(), key=lambda h: h.key)))
        self.queue.unorder(h)
        self.queue.order(h)

    @rule(room=st.integers(1, 5), tags=st.none() | st.frozensets(st.sampled_from(TAGS[1:]), min_size=1))
    def pull(self, room, tags):
        chosen = self.queue.best(room, tags)
        expected, keys = [], set()
        for h in sorted(self.model.values(), key=lambda h: h.key):
            if len(expected) == room:
                break
            if tags is not None and h.tag not in tags:
                continue
            if h.serial_key:
                if h.serial_key in keys:
                    continue
                keys.add(h.serial_key)
            expected.append(h)
        assert chosen == expected
        for h in chosen:  # taken: out of the order, as the windows take them
            self.queue.unorder(h)
            del self.model[h.location]
        for h in [h for h in self.model.values() if h.serial_key in keys]:  # their keys' others: parked
            self.queue.unorder(h)
            del self.model[h.location]

    @rule()
    def best_head(self):
        """What a node of shards tells the others: the (priority, trigger time) a pull here takes first."""
        best = min(self.model.values(), key=lambda h: h.key, default=None)
        assert self.queue.best_head() == (None if best is None else (-best.key[0], best.key[1]))

    @rule()
    def last(self):
        worst = max(self.model.values(), key=lambda h: h.key, default=None)
        assert self.queue.last() is worst

    @invariant()
    def the_heaps_are_bounded_and_the_order_is_the_model(self):
        queue = self.queue
        assert queue.ready == self.model
        assert len(queue.heap) <= queue.entries and len(queue.worst) <= queue.entries
        assert all(len(tagged) <= queue.entries for tagged in queue.by_tag.values())
        assert queue.entries <= 2 * len(queue.ready) + ORDER_SLACK + 1


OrderMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)
TestTopicQueueOrder = OrderMachine.TestCase


def test_a_drained_order_keeps_no_stale_entries_beyond_the_slack():
    queue = TopicQueue("t", 1)
    messages = [held(n, 0, n, "", "") for n in range(1000)]
    for h in messages:
        queue.order(h)
    for h in messages:
        queue.unorder(h)
    assert queue.ready == {} and queue.entries <= ORDER_SLACK
    assert len(queue.heap) <= ORDER_SLACK and len(queue.worst) <= ORDER_SLACK


def test_the_last_is_made_when_first_asked_for_then_kept_until_a_rebuild():
    """A drain's window (messages enter, pulls take them) never makes the
    worst-first heap, nor files its untagged messages under a tag; once a
    full window asks for its last, the heap is kept as messages enter,
    and a rebuild lets it go until it is asked for again."""
    queue = TopicQueue("t", 1)
    messages = [held(n, n % 3, n, "a" if n % 4 == 0 else "", "") for n in range(300)]
    for h in messages[:200]:
        queue.order(h)
    assert queue.worst == [] and not queue.worst_kept
    assert set(queue.by_tag) == {"a"} and len(queue.by_tag["a"]) == 50
    worst = max(queue.ready.values(), key=lambda h: h.key)
    assert queue.last() is worst and queue.worst_kept
    for h in messages[200:]:
        queue.order(h)
    assert queue.last() is max(queue.ready.values(), key=lambda h: h.key)
    for h in queue.best(250, None):
        queue.unorder(h)  # (a rebuild once the stale entries outnumber what is left)
    assert not queue.worst_kept and queue.worst == []
    assert queue.last() is max(queue.ready.values(), key=lambda h: h.key)
