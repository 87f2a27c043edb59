"""Leader election: pysyncobj's Raft, and the one fact it replicates.

pysyncobj runs Raft in a thread of its own on the node's replication port.
Raft guarantees at most one leader per term, and a term's leader has been
voted for by a majority. hourglass uses Raft only for that and for two
small replicated facts: `claimed = (term, node_id)`, "the leader of `term`
is `node_id`, and has caught up"; and the push subscriptions (a few per
topic at most, broker.push.pusher), which the leader pushes; and the recurring
schedules' entries (broker.cluster.schedules lays them out), whose runs
the leader makes; and the topic settings' entries (broker.flow.settings:
a topic's settings, its pauses). A node that Raft makes leader in term T
  1. gets a promise and the log position of a majority (broker.cluster),
  2. catches its commit log up to the most advanced of them,
  3. replicates `claim(T, me)` through Raft: committed means a majority
     has accepted term T, so no older leader can commit anything more,
and only then answers writes and runs the wheel. The commit log itself does
not go through Raft (it streams by offset, replication.log_stream).

The term is the *epoch* of every record the leader appends (see
replication.epochs).

`Election` is the interface the node uses; `replication.raft.RaftElection`
implements it with pysyncobj (public API only); tests use `FakeElection`
(tests/fakes.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Election(Protocol):
    """This node's view of the election, and its one write.

    Raft may call a node leader before it has caught up; only a committed
    `claim(T)` makes it the leader of T. `RaftElection` is the real one,
    `FakeElection` (tests/fakes.py) a hand-set one for tests."""

    @property
    def term(self) -> int:
        """The Raft term this node is in (grows by one an election)."""
        ...

    @property
    def is_leader(self) -> bool:
        """Raft thinks this node leads (it may not have claimed yet)."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The node Raft last named leader (None: none known)."""
        ...

    @property
    def claimed(self) -> tuple[int, str | None]:
        """(term, node) of the highest committed claim this node has applied."""
        ...

    async def claim(self, term: int) -> bool:
        """Replicate "I lead `term`"; True once a majority has committed it."""
        ...

    def subscriptions(self) -> dict[str, bytes]:
        """The push subscriptions this node has applied: topic -> the
        subscription as stored (broker.push.rules.Subscription.stored, JSON)."""
        ...

    async def set_subscription(self, topic: str, stored: bytes | None) -> bool:
        """Replicate the topic's subscription (None: none); True once a
        majority has committed it."""
        ...

    async def transfer_lead(self) -> bool:
        """Before leaving: if Raft calls this node leader, ask it to hand
        the lead to its most caught-up follower at once (Raft's TimeoutNow),
        and wait a moment for it; True once another node leads. False (the
        others then elect after their election timeout) when it was not
        leading, no follower had all of Raft's log, or none took it in time."""
        ...

    def schedules(self) -> dict[str, bytes]:
        """The recurring schedules' entries this node has applied: key ->
        value (a copy; broker.cluster.schedules lays them out)."""
        ...

    async def set_schedules(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        """Replicate these entries (None: removed), in order, as one
        command; True once a majority has committed it."""
        ...

    def topic_settings(self) -> dict[str, bytes]:
        """The topic settings' entries this node has applied: key -> value
        (a copy; broker.flow.settings lays them out)."""
        ...

    async def set_topic_settings(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        """Replicate these entries (None: removed), in order, as one
        command; True once a majority has committed it."""
        ...

    def close(self) -> None:
        """Leave the group (on stopping)."""
        ...
