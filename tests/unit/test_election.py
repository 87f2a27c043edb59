"""replication.election: RaftElection keeps the Election interface over
pysyncobj's public API (a one-node group elects itself at once), and
FakeElection behaves like it for the tests of the roles."""

from __future__ import annotations

import asyncio
import pathlib
import re
import time

import pytest
from serving import free_port

from broker.clock import SystemClock
from replication.config import ClusterConfig, Peer
from replication.election import Election, FakeElection
from replication.raft import STATUS_READS, RaftElection

ELECTION = pathlib.Path(__file__).resolve().parents[2] / "replication" / "raft.py"


def test_no_private_pysyncobj_name_is_used():
    text = ELECTION.read_text()
    assert re.findall(r"_raft\._\w+", text) == []
    assert "_isLeader" not in text and "_getLeader" not in text


def test_a_one_node_raft_group_elects_itself_and_commits_claims(tmp_path):
    me = Peer("n1", "127.0.0.1", free_port(), free_port())
    config = ClusterConfig("n1", {"n1": me}, insecure=True)

    async def main():
        election: Election = RaftElection(config, str(tmp_path), SystemClock())
        try:
            deadline = time.monotonic() + 10
            while not election.is_leader and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert election.is_leader and election.leader_id == "n1" and election.term >= 1
            assert election.claimed == (0, None)
            term = election.term
            assert await election.claim(term)
            assert election.claimed == (term, "n1")
            assert not await election.claim(term)  # a claim must be above the claimed term
            assert "is_leader=True" in repr(election)
        finally:
            election.close()

    asyncio.run(main())


def test_the_fake_election_commits_claims_above_the_claimed_term():
    async def main():
        election: Election = FakeElection("n1", term=3, leader_id="n1")
        assert isinstance(election, FakeElection) and election.is_leader
        assert await election.claim(3) and election.claimed == (3, "n1")
        assert not await election.claim(3)
        election.claims_commit = False
        assert not await election.claim(4) and election.claimed == (3, "n1")
        assert election.claims == [3, 3, 4]
        election.leader_id = "n2"
        assert not election.is_leader
        election.close()
        assert election.closed

    asyncio.run(main())


def test_a_status_read_that_meets_a_change_by_pysyncobjs_thread_is_read_again():
    """getStatus() iterates pysyncobj's peer dicts while its thread may
    change them: the election reads again instead of failing the role loop."""

    class Racing:
        def __init__(self, failures: int) -> None:
            self.failures = failures
            self.reads = 0

        def getStatus(self) -> dict:
            self.reads += 1
            if self.reads <= self.failures:
                raise RuntimeError("dictionary changed size during iteration")
            return {"self": "me", "leader": "me"}

    election = RaftElection.__new__(RaftElection)
    election._raft = Racing(failures=STATUS_READS - 1)
    assert election.is_leader and election._raft.reads == STATUS_READS
    election._raft = Racing(failures=STATUS_READS)
    with pytest.raises(RuntimeError, match="changed size"):
        _ = election.is_leader

