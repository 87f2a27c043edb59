"""replication.election: RaftElection keeps the Election interface over
pysyncobj's public API (a one-node group elects itself at once), and
FakeElection behaves like it for the tests of the roles. Its transport
(replication.raft_transport) hooks into pysyncobj's through the names it
lists in PYSYNCOBJ_HOOKS only, each of which must exist in the installed
pysyncobj."""

from __future__ import annotations

import ast
import asyncio
import pathlib
import re
import time

import pytest
from fakes import FakeElection
from serving import free_port

from broker.clock import SystemClock
from replication.config import ClusterConfig, Peer
from replication.election import Election
from replication.raft import STATUS_READS, RaftElection
from replication.raft_transport import PYSYNCOBJ_HOOKS

ELECTION = pathlib.Path(__file__).resolve().parents[2] / "replication" / "raft.py"
TRANSPORT = ELECTION.parent / "raft_transport.py"


def test_no_private_pysyncobj_name_is_used():
    text = ELECTION.read_text()
    assert re.findall(r"_raft\._\w+", text) == []
    assert "_isLeader" not in text and "_getLeader" not in text


def _private_names_used(source: str) -> set[str]:
    """Private names (`_name`) that `source` reads, writes or overrides
    (defines as a method), less the module's own: its other functions and
    methods, and what its constructors set on self."""
    tree = ast.parse(source)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    names = functions | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    own = set(functions)
    for init in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
        for node in ast.walk(init):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Attribute):
                        own.add(t.attr)
    hooks = {name for names in PYSYNCOBJ_HOOKS.values() for name in names}
    private = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return private - (own - hooks)


def test_the_transport_uses_only_the_pysyncobj_hooks_it_lists():
    """pysyncobj's `transportClass` is its documented extension point, but
    replacing its connections means overriding two construction steps of
    its TCPTransport and reading its poller: those names, and no other
    private one, are listed where the transport is written."""
    listed = {name for names in PYSYNCOBJ_HOOKS.values() for name in names if name.startswith("_")}
    assert _private_names_used(TRANSPORT.read_text()) == listed
    assert _private_names_used("class C:\n    def __init__(self):\n        self._own, self._too = 1, 2\n"
                               "    def _mine(self, x):\n        return x._theirs, self._own\n") == {"_theirs"}


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
            # every pysyncobj name the transport relies on exists in the installed pysyncobj
            for name in PYSYNCOBJ_HOOKS["TCPTransport"]:
                assert hasattr(election.transport, name), name
            for name in PYSYNCOBJ_HOOKS["SyncObj"]:
                assert hasattr(election._raft, name), name
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

