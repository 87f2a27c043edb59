"""broker.cluster.schedules: the schedules' records as Raft entries. What a
leader writes, the next one reads back (rows, stale runs); a long schedule
is cut into parts, every command stays within COMMAND_BYTES (so no Raft
frame outgrows the transport's bound), a replacement leaves no part of the
version it replaced, and a write no majority committed raises."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import hypothesis.strategies as st
import pytest
from fakes import FakeElection
from hypothesis import given, settings

from broker.cluster.schedules import COMMAND_BYTES, RaftScheduleStore
from broker.schedules.file import Row
from storage.errors import Unavailable


class RecordingElection(FakeElection):
    def __init__(self) -> None:
        super().__init__("n1", term=1, leader_id="n1")
        self.commands: list[list[tuple[str, bytes | None]]] = []

    async def set_schedules(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        self.commands.append(list(changes))
        return await super().set_schedules(changes)


def row(sid: str, version: int, msg: str, pending: int | None = 1000, topic: str = "t") -> Row:
    return {"topic": topic, "scheduleId": sid, "cron": None, "everyMillis": 1000, "timeZone": "UTC", "msg": msg,
            "version": version, "paused": False, "pending": pending, "runs": 1, "catchUp": 0,
            "lastRuns": [[900, 3, False]], "stale": None}


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_what_one_leader_writes_the_next_reads_back():
    election = RecordingElection()
    store = RaftScheduleStore(election)
    rows = [row("a", 1, "short"), row("b", 1, "é" * 5000), row("c", 3, "x" * 20_000, pending=None)]
    run(store.write([{"put": r} for r in rows]))
    again = RaftScheduleStore(election)
    assert again.rows == {("t", r["scheduleId"]): r for r in rows}  # type: ignore[misc]
    # a run made: its progress alone is written
    before = len(election.commands)
    run(again.write([{"put": {**rows[2], "pending": 2000, "runs": 2}}]))
    written = [k for c in election.commands[before:] for k, _ in c]
    assert written == ['["p","t","c"]']
    assert RaftScheduleStore(election).rows[("t", "c")]["pending"] == 2000


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=9000), min_size=1, max_size=6))
def test_every_command_stays_within_its_bound(msgs):
    election = RecordingElection()
    store = RaftScheduleStore(election)
    run(store.write([{"put": row(f"s{i}", 1, m)} for i, m in enumerate(msgs)]))
    run(store.write([{"put": row(f"s{i}", 2, m[::-1])} for i, m in enumerate(msgs)]))  # replaced: new parts
    for command in election.commands:
        assert sum(len(k) + len(v or b"") for k, v in command) <= COMMAND_BYTES
        assert len(pickle.dumps(command, protocol=2)) <= 2 * COMMAND_BYTES + 1024
    again = RaftScheduleStore(election)
    assert {k: r["msg"] for k, r in again.rows.items()} == {("t", f"s{i}"): m[::-1] for i, m in enumerate(msgs)}
    # no part of a version replaced is left
    parts = [k for k in election.schedule_entries if k.startswith('["t"')]
    assert all(',2,' in k for k in parts), parts


def test_delete_leaves_its_run_to_delete_until_forgotten():
    election = RecordingElection()
    store = RaftScheduleStore(election)
    run(store.write([{"put": row("a", 1, "y" * 10_000)}]))
    run(store.write([{"delete": ["t", "a"], "stale": "a@1000"}]))
    again = RaftScheduleStore(election)
    assert again.rows == {} and again.stale == {("t", "a"): "a@1000"}
    assert [k for k in election.schedule_entries if not k.startswith('["x"')] == []  # its parts too
    run(again.forget_stale([("t", "a")]))
    assert election.schedule_entries == {}


def test_a_write_no_majority_committed_raises_and_is_written_whole_again():
    election = RecordingElection()
    store = RaftScheduleStore(election)
    election.claims_commit = False
    with pytest.raises(Unavailable):
        run(store.write([{"put": row("a", 1, "m")}]))
    election.claims_commit = True
    run(store.write([{"put": row("a", 1, "m")}]))
    assert RaftScheduleStore(election).rows[("t", "a")]["msg"] == "m"
