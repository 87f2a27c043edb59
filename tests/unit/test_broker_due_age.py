"""maxDueAgeMillis (docs/api.md, "Flow") in broker.disk.ready.TopicQueue's
pull order, against a sorted list: messages due longer than the cap are
handed out first, oldest first (one of a serial key at most; a pull by
tags stops at the oldest of another tag), then the rest by priority --
with messages entering, leaving and coming back, the cap set and cleared,
and time passing, on a plain topic and a fair one. The extra heap
(`by_due`) stays bounded as the others are."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.transitions import MessageState
from broker.disk.ready import ORDER_SLACK, HeldMessage, TopicQueue
from storage.entry import Location, Status

TAGS = ("", "a")
KEYS = ("", "", "k1")


def held(n: int, priority: int, trigger_ms: int, tag: str, serial_key: str) -> HeldMessage:
    location = Location(7 + n % 2, n)
    return HeldMessage(location, "t", tag, f"m{n}", 1, serial_key, (-priority, trigger_ms, location),
                       MessageState(Status.READY, 0, 3, trigger_ms, 60_000))


def expected_pull(model: dict[Location, HeldMessage], room: int, tags: frozenset[str] | None, cap_ms: int,
                  now_ms: int) -> list[HeldMessage]:
    """The rule, written plainly: the aged ones oldest first, then priority order."""
    out: list[HeldMessage] = []
    keys: set[str] = set()
    if cap_ms:
        for h in sorted(model.values(), key=lambda h: (h.key[1], h.location)):
            if len(out) == room or h.key[1] >= now_ms - cap_ms:
                break
            if tags is not None and h.tag not in tags:
                break
            if h.serial_key:
                if h.serial_key in keys:
                    continue
                keys.add(h.serial_key)
            out.append(h)
    for h in sorted(model.values(), key=lambda h: h.key):
        if len(out) == room:
            break
        if h in out or (tags is not None and h.tag not in tags):
            continue
        if h.serial_key:
            if h.serial_key in keys:
                continue
            keys.add(h.serial_key)
        out.append(h)
    return out


class DueAgeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = TopicQueue("t", 1)
        self.model: dict[Location, HeldMessage] = {}
        self.made = 0
        self.now_ms = 100
        self.cap_ms = 0

    @rule(priority=st.integers(-1, 1), age_ms=st.integers(0, 60), tag=st.sampled_from(TAGS),
          serial_key=st.sampled_from(KEYS))
    def enter(self, priority, age_ms, tag, serial_key):
        h = held(self.made, priority, self.now_ms - age_ms, tag, serial_key)
        self.made += 1
        self.queue.order(h)
        self.model[h.location] = h

    @precondition(lambda self: self.model)
    @rule(data=st.data(), back=st.booleans())
    def leave(self, data, back):
        """An ack, a delete, a park (`back`: a nack, in again)."""
        h = data.draw(st.sampled_from(sorted(self.model.values(), key=lambda h: h.key)))
        self.queue.unorder(h)
        if back:
            self.queue.order(h)
        else:
            del self.model[h.location]

    @rule(cap_ms=st.sampled_from([0, 10, 30]))
    def set_cap(self, cap_ms):
        self.cap_ms = cap_ms
        self.queue.set_max_due_age(cap_ms)

    @rule(ms=st.integers(1, 20))
    def time_passes(self, ms):
        self.now_ms += ms

    @rule(room=st.integers(1, 4), tags=st.none() | st.just(frozenset({"a"})))
    def pull(self, room, tags):
        chosen = self.queue.best(room, tags, self.now_ms)
        expected = expected_pull(self.model, room, tags, self.cap_ms, self.now_ms)
        assert chosen == expected
        keys = {h.serial_key for h in chosen if h.serial_key}
        for h in chosen:
            self.queue.unorder(h)
            del self.model[h.location]
        for h in [h for h in self.model.values() if h.serial_key in keys]:  # their keys' others: parked
            self.queue.unorder(h)
            del self.model[h.location]

    @invariant()
    def the_order_is_the_model_and_by_due_is_bounded(self):
        queue = self.queue
        assert queue.ready == self.model
        assert len(queue.by_due) <= queue.entries <= 2 * len(queue.ready) + ORDER_SLACK + 1
        assert queue.by_due == [] or queue.max_due_age_ms


DueAgeMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)
TestDueAgeOrder = DueAgeMachine.TestCase


def test_aged_messages_go_first_oldest_first_then_priority():
    """The worked example of TopicQueue._aged: cap 10 s, now 100 s."""
    queue = TopicQueue("t", 1)
    queue.set_max_due_age(10_000)
    a, b, c = held(0, 9, 95_000, "", ""), held(1, 0, 80_000, "", ""), held(2, 0, 85_000, "", "")
    for h in (a, b, c):
        queue.order(h)
    assert [h.msg_id for h in queue.best(3, None, 100_000)] == ["m1", "m2", "m0"]
    plain = TopicQueue("t", 1)
    for h in (a, b, c):
        plain.order(h)
    assert [h.msg_id for h in plain.best(3, None, 100_000)] == ["m0", "m1", "m2"]


def test_a_fair_topic_hands_aged_messages_out_first_too():
    queue = TopicQueue("t", 1, fair=True)
    queue.set_max_due_age(10_000)
    young = [held(n, 5, 99_000, "", "") for n in range(3)]
    old = held(9, 0, 50_000, "", "")
    for h in (*young, old):
        queue.order(h)
    assert queue.best(1, None, 100_000) == [old]
