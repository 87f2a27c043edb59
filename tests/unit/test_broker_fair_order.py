"""broker.disk.ready.TopicQueue's pull order on a fair topic (docs/api.md,
"Fairness between tenants") against a model: a list of groups taking turns
and, per group, its messages sorted by (-priority, triggerTime). Messages
of groups (fairKeys, "" among them) enter and leave the order; a pull of N
takes from the group at the front of the rotation, which goes to the back;
a group with nothing this pull may take (tags, a serial key taken already)
keeps its place; one with nothing in the order leaves the rotation. After
every step the heaps stay bounded and the order is the model's.

The property that follows, checked on every pull: while a group has a
message a pull may take, no other group is handed two messages before it
is handed one -- a group's backlog holds another's message a round at
most."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.transitions import MessageState
from broker.disk.ready import ORDER_SLACK, HeldMessage, TopicQueue
from storage.entry import Location, Status

GROUPS = ("", "A", "B", "C")
TAGS = ("", "a")
KEYS = ("", "", "", "k1", "k2")


def held(n: int, group: str, priority: int, trigger_ms: int, tag: str, serial_key: str) -> HeldMessage:
    location = Location(7 + n % 2, n)
    return HeldMessage(location, "t", tag, f"m{n}", 1, serial_key, (-priority, trigger_ms, location),
                       MessageState(Status.READY, 0, 3, trigger_ms, 60_000), None, group)


class FairOrderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = TopicQueue("t", 1, fair=True)
        self.model: dict[Location, HeldMessage] = {}  # what the order holds
        self.rotation: list[str] = []  # the groups' turns, as the model keeps them
        self.made = 0

    def _enter(self, h: HeldMessage) -> None:
        self.queue.order(h)
        if h.fair_key not in self.rotation:
            self.rotation.append(h.fair_key)
        self.model[h.location] = h

    @rule(group=st.sampled_from(GROUPS), priority=st.integers(-1, 1), trigger_ms=st.integers(0, 3),
          tag=st.sampled_from(TAGS), serial_key=st.sampled_from(KEYS), copies=st.integers(1, 6))
    def enter(self, group, priority, trigger_ms, tag, serial_key, copies):
        for _ in range(copies):  # (a backlog of one group, some at once)
            self._enter(held(self.made, group, priority, trigger_ms, tag, serial_key))
            self.made += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave(self, data):
        """An ack by id, a delete, an expiry: out of the order."""
        h = data.draw(st.sampled_from(sorted(self.model.values(), key=lambda h: h.key)))
        self.queue.unorder(h)
        del self.model[h.location]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave_and_come_back(self, data):
        """A nack: out of the order, then in again (its group's turn kept)."""
        h = data.draw(st.sampled_from(sorted(self.model.values(), key=lambda h: h.key)))
        self.queue.unorder(h)
        del self.model[h.location]
        self._enter(h)

    @rule(room=st.integers(1, 7), tags=st.none() | st.just(frozenset({"a"})))
    def pull(self, room, tags):
        chosen = self.queue.best(room, tags)
        expected, keys, skipped = [], set(), []
        taken: set[Location] = set()

        def takeable(h: HeldMessage) -> bool:
            return (h.location not in taken and (tags is None or h.tag in tags)
                    and not (h.serial_key and h.serial_key in keys))
        while len(expected) < room and self.rotation:
            group = self.rotation.pop(0)
            mine = sorted((h for h in self.model.values() if h.fair_key == group), key=lambda h: h.key)
            best = next((h for h in mine if takeable(h)), None)
            if best is not None:
                expected.append(best)
                taken.add(best.location)
                if best.serial_key:
                    keys.add(best.serial_key)
                self.rotation.append(group)
            elif mine:
                skipped.append(group)
        self.rotation[:0] = skipped
        assert chosen == expected
        self._one_round_at_most(chosen, tags, keys)
        for h in chosen:  # taken: out of the order, as the windows take them
            self.queue.unorder(h)
            del self.model[h.location]
        for h in [h for h in self.model.values() if h.serial_key in keys]:  # their keys' others: parked...
            self.queue.unorder(h)
            del self.model[h.location]
            self._enter(h)  # ... and back at once (acked): their group's turn kept

    def _one_round_at_most(self, chosen: list[HeldMessage], tags, keys: set[str]) -> None:
        """No group is handed a second message while another group that
        has one this pull could take waits."""
        left = {h.location for h in chosen}
        waiting = {h.fair_key for h in self.model.values() if h.location not in left
                   and (tags is None or h.tag in tags) and not (h.serial_key and h.serial_key in keys)}
        served = [h.fair_key for h in chosen]
        for group in waiting - set(served):
            assert len(served) == len(set(served)), (group, served)

    @rule()
    def last_of_a_group(self):
        for group in GROUPS:
            worst = max((h for h in self.model.values() if h.fair_key == group), key=lambda h: h.key, default=None)
            assert self.queue.last(group) is worst

    @invariant()
    def the_heaps_are_bounded_and_the_order_is_the_model(self):
        queue = self.queue
        assert queue.ready == self.model
        assert queue.entries <= 2 * len(queue.ready) + ORDER_SLACK + 1
        for name, group in queue.groups.items():
            assert len(group.heap) <= queue.entries and len(group.worst) <= queue.entries
            assert group.ordered == sum(1 for h in self.model.values() if h.fair_key == name)
        assert queue.heap == [] and queue.by_tag == {}
        # (the rotation may still name a group whose messages all left: it goes at its turn)
        assert [g for g in queue.rotation if queue.groups[g].ordered] == \
            [g for g in self.rotation if any(h.fair_key == g for h in self.model.values())]


FairOrderMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestFairOrder = FairOrderMachine.TestCase


def test_a_backlog_of_one_group_holds_another_a_round_at_most():
    """A's 100 messages, then one of B's: pulls of 3 hand B's out in the
    first, after A's first."""
    queue = TopicQueue("t", 1, fair=True)
    for n in range(100):
        queue.order(held(n, "A", 0, n, "", ""))
    queue.order(held(100, "B", 0, 1000, "", ""))
    chosen = queue.best(3, None)
    assert [(h.fair_key, h.msg_id) for h in chosen] == [("A", "m0"), ("B", "m100"), ("A", "m1")]


def test_turns_carry_over_between_pulls():
    queue = TopicQueue("t", 1, fair=True)
    for n, group in enumerate("AAABBBCCC"):
        queue.order(held(n, group, 0, n, "", ""))
    handed = []
    for _ in range(4):
        for h in queue.best(2, None):
            handed.append(h.fair_key)
            queue.unorder(h)
    assert "".join(handed) == "ABCABCAB"
