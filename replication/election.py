"""Leader election: pysyncobj's Raft, and the one fact it replicates.

pysyncobj runs Raft in a thread of its own on the node's replication port.
Raft guarantees at most one leader per term, and a term's leader has been
voted for by a majority. hourglass uses Raft only for that and for one
small replicated fact, `claimed = (term, node_id)`: "the leader of `term`
is `node_id`, and has caught up". A node that Raft makes leader in term T
  1. gets a promise and the log position of a majority (broker.cluster),
  2. catches its commit log up to the most advanced of them,
  3. replicates `claim(T, me)` through Raft: committed means a majority
     has accepted term T, so no older leader can commit anything more,
and only then answers writes and runs the wheel. The commit log itself does
not go through Raft (it streams by offset, replication.log_stream).

The term is the *epoch* of every record the leader appends (see
replication.epochs).

`Election` is the interface the node uses; `replication.raft.RaftElection`
implements it with pysyncobj (public API only), `FakeElection` for tests.
"""

from __future__ import annotations

from typing import Protocol


class Election(Protocol):
    """This node's view of the election, and its one write.

    Raft may call a node leader before it has caught up; only a committed
    `claim(T)` makes it the leader of T. `RaftElection` is the real one,
    `FakeElection` a hand-set one for tests."""

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

    def close(self) -> None:
        """Leave the group (on stopping)."""
        ...


class FakeElection:
    """An `Election` a test sets by hand: the term, whom Raft calls leader,
    and whether claims commit. A claim commits (when `claims_commit`) only
    above the highest claimed term, as the Raft one does.

        election = FakeElection("n1", term=3, leader_id="n1")
        await election.claim(3)       # True: claimed == (3, "n1")
        await election.claim(3)       # False: not above the claimed term
    """

    def __init__(self, node_id: str, term: int = 0, leader_id: str | None = None) -> None:
        self.node_id = node_id
        self.term = term
        self.leader_id = leader_id
        self.claimed: tuple[int, str | None] = (0, None)
        self.claims_commit = True
        self.claims: list[int] = []  # every term claimed, committed or not
        self.closed = False

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.node_id

    async def claim(self, term: int) -> bool:
        self.claims.append(term)
        if not self.claims_commit or term <= self.claimed[0]:
            return False
        self.claimed = (term, self.node_id)
        return True

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"FakeElection(node={self.node_id}, term={self.term}, leader={self.leader_id}, claimed={self.claimed})"
