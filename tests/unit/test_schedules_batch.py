"""broker.schedules.keeper at size, in counts: the runs one tick releases are
followed in slices of ADVANCE_SLICE, each one write of their progress and
one batched send (not one of each a run); what a schedule holds in RAM
stays under a ceiling once its last runs are full; the schedules file's
"runs" records read back as the rows they stand for, and a version-1
file is read and rewritten as version 2. A schedule owns its progress: a
purge of many pending runs is followed in slices, each schedule going on
with its next run; a run deleted with no one told is seen by its check; a
run id held by a message the schedule did not make is a conflict, not a
wait; a run acked before its time is followed. Real Store and schedules
file, a FakeClock."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import struct
import tracemalloc
from typing import Any

import pytest
from broker_harness import BrokerHarness

import broker.core.recurrence
from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.core.params import Defaults, DeleteRequest, PullRequest
from broker.core.recurrence import Misfire
from broker.disk.ready import QueueLimits
from broker.schedules.file import HEADER, MAGIC, ScheduleFile, frame
from broker.schedules.keeper import ADVANCE_SLICE, CHECK_AFTER_MS, CHECK_SLICE, LAST_RUNS, REPAIR_INTERVAL_S, ScheduleLimits, Schedules
from broker.schedules.params import ScheduleSpec
from storage.entry import Status
from storage.errors import CorruptionError, NewerFormatError
from storage.types import NewMessage

MINUTE_MS = 60_000
START_MS = 1_750_000_020_000  # 20 s into a minute
TOPIC = "t"
# What a schedule (cron `* * * * *`, a short msg) may hold in RAM once its
# last runs are full: its state, spec, time rules, counts and the maps'
# entries, as tracemalloc attributes them to the schedules' modules and to
# this file (which makes the specs). 2,230 bytes before the states were
# made compact (dataclasses with dicts, a tuple of three objects a last
# run, the scheduleId parsed from each run's msgId kept); about 900 since,
# then 1,131 (the sources) and 1,268 (the compiled build) once a schedule
# owns its progress: its pending run's place (a map entry) and its check
# (a heap entry) held beside it.
MAX_BYTES_PER_SCHEDULE = 1400
SCHEDULE_FILES = ("broker/schedules/keeper.py", "broker/schedules/params.py", "broker/core/recurrence.py",
                  "broker/schedules/file.py", "tests/unit/test_schedules_batch.py")


def spec(i: int, cron: str = "* * * * *") -> ScheduleSpec:
    return ScheduleSpec(TOPIC, f"s{i:05d}", cron, None, "UTC", "run", 3_600_000, 3, 0, "", "", START_MS, None, None,
                        0, Misfire.ONCE, 60_000, 10)


class CountingSends:
    """The broker as the schedules see it, noting the messages of each send
    (a wrapper: the compiled build's Broker takes no attribute of a test's)."""

    def __init__(self, broker: Any, sends: list[int]) -> None:
        self._broker = broker
        self._sends = sends

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    async def send(self, sends: Any) -> Any:
        self._sends.append(len(sends))
        return await self._broker.send(sends)


class Node:
    """A Broker and its Schedules over a schedules file, counting the
    schedules' writes and the backend's sends."""

    def __init__(self) -> None:
        self.h = BrokerHarness("hourglass-schedbatch-", START_MS, QueueLimits(), Defaults())
        self.path = os.path.join(self.h.directory, "schedules")
        self.writes: list[int] = []  # schedules written by each write of runs' progress
        self.sends: list[int] = []  # messages in each send
        self.h.open_broker()
        self.schedules = self._schedules()

    def _schedules(self) -> Schedules:
        file = ScheduleFile(self.path, fsync=False)
        write_runs = file.write_runs

        async def counted(states: Any) -> None:
            self.writes.append(len(states))
            await write_runs(states)
        file.write_runs = counted  # type: ignore[method-assign]
        schedules = Schedules(file, self.h.clock, ScheduleLimits(max_schedules=100_000, max_bytes=1 << 40))
        broker = self.h.broker
        assert broker is not None
        broker.on_release, broker.on_cancel = schedules.on_release, schedules.on_cancel

        async def start() -> None:
            schedules.start(CountingSends(broker, self.sends))  # type: ignore[arg-type]
            await self.h.quiesce()
        self.h.run(start())
        return schedules

    def put(self, count: int, cron: str = "* * * * *") -> None:
        async def put_all() -> None:
            await asyncio.gather(*(self.schedules.put(spec(i, cron), None) for i in range(count)))
        self.h.run(put_all())
        self.h.run(self.h.quiesce())

    def advance_to(self, at_ms: int) -> None:
        """Time passes to `at_ms`; then until the worker has followed every release."""
        self.h.advance_to(at_ms)
        while not self.schedules.idle():
            self.h.run(asyncio.sleep(0.001))
            self.h.run(self.h.quiesce())

    def drain(self) -> list[str]:
        async def pull_all() -> list[str]:
            ids: list[str] = []
            while batch := await self.h.broker.pull(PullRequest(TOPIC, 60_000, 1000, ())):  # type: ignore[union-attr]
                ids += [m.msg_id for m in batch]
                await self.h.broker.ack_many(TOPIC, [m.msg_id for m in batch])  # type: ignore[union-attr]
            return ids
        return self.h.run(pull_all())

    def call(self, coro: Any) -> Any:
        """A broker call's answer, once the schedules followed what it did."""
        answer = self.h.run(coro)
        self.advance_to(self.h.clock.now_ms())
        return answer

    def restart(self) -> None:
        self.h.run(self.schedules.stop())
        self.schedules.close()
        self.h.restart()
        self.schedules = self._schedules()

    def close(self) -> None:
        self.h.run(self.schedules.stop())
        self.schedules.close()
        self.h.teardown()


@pytest.fixture
def node() -> Any:
    n = Node()
    yield n
    n.close()


@pytest.mark.parametrize("count", [ADVANCE_SLICE - 50, 2 * ADVANCE_SLICE + 300])
def test_the_runs_one_tick_releases_make_one_write_and_one_send_a_slice(node: Node, count: int) -> None:
    node.put(count)
    first = (START_MS // MINUTE_MS + 1) * MINUTE_MS
    assert sum(node.sends) == count and len(node.sends) <= 2  # the puts: the first alone, the rest together
    node.writes.clear()
    node.sends.clear()
    node.advance_to(first)
    slices = -(-count // ADVANCE_SLICE)
    assert len(node.writes) == slices and sum(node.writes) == count and max(node.writes) <= ADVANCE_SLICE
    assert len(node.sends) == slices and sum(node.sends) == count
    assert sorted(node.drain()) == sorted(f"s{i:05d}@{first}" for i in range(count))
    following = first + MINUTE_MS
    for i in (0, count // 2, count - 1):
        message = node.h.run(node.h.broker.get(TOPIC, f"s{i:05d}@{following}"))  # type: ignore[union-attr]
        assert message.status is Status.WAITING and message.trigger_ms == following
    # what the "runs" records say reads back after a restart, and the runs go on from it
    node.restart()
    for i in (0, count - 1):
        state = node.schedules.get(TOPIC, f"s{i:05d}")
        assert (state.pending, state.runs, state.last_runs) == (following, 2, [(first, 0, False)])
    node.writes.clear()
    node.advance_to(following)
    assert len(node.writes) == slices
    assert sorted(node.drain()) == sorted(f"s{i:05d}@{following}" for i in range(count))


def test_a_schedule_holds_under_its_ceiling_in_ram_once_its_last_runs_are_full(node: Node) -> None:
    count = 1000
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        node.put(count, cron="* * * * * *")  # every second
        at = node.h.clock.now_ms() // 1000 * 1000
        for _ in range(LAST_RUNS + 2):
            at += 1000
            node.advance_to(at)
            assert len(node.drain()) == count
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    state = node.schedules.get(TOPIC, "s00000")
    assert len(state.last_runs) == LAST_RUNS and state.released == LAST_RUNS + 2
    held = sum(s.size_diff for s in after.compare_to(before, "filename")
               if s.traceback[0].filename.endswith(SCHEDULE_FILES))
    assert held / count < MAX_BYTES_PER_SCHEDULE, held / count


def row(sid: str, version: int = 1, pending: int | None = 60_000) -> dict[str, object]:
    return {**spec(0).public(), "scheduleId": sid, "version": version, "paused": False, "pending": pending,
            "runs": 1, "catchUp": 0, "lastRuns": [], "stale": None}


def test_runs_records_read_back_as_rows_and_keep_the_last_runs(tmp_path: Any) -> None:
    path = str(tmp_path / "schedules")
    file = ScheduleFile(path, fsync=False)
    file.append([{"put": row("a")}, {"put": row("b")}])
    for k in range(1, LAST_RUNS + 3):
        file.append([{"runs": [[TOPIC, "a", 1, 60_000 * (k + 1), k + 1, 0, 60_000 * k, k, k % 2 == 0]]}])
    file.close()
    again = ScheduleFile(path, fsync=False)
    a = again.rows[(TOPIC, "a")]
    assert (a["pending"], a["runs"]) == (60_000 * (LAST_RUNS + 3), LAST_RUNS + 3)
    assert a["lastRuns"] == [[60_000 * k, k, k % 2 == 0] for k in range(3, LAST_RUNS + 3)]
    assert again.rows[(TOPIC, "b")]["lastRuns"] == []
    again.close()


# What opening a schedules file may hold a schedule beyond the file's bytes
# (its rows are built when read: a dict of each held at once was ~3 KB).
MAX_OPEN_BYTES_PER_SCHEDULE = 600


def test_opening_holds_no_row_a_schedule_until_it_is_read(tmp_path: Any) -> None:
    path = str(tmp_path / "schedules")
    file = ScheduleFile(path, fsync=False)
    count = 2000
    file.append([{"put": {**row(f"s{i:05d}"), "lastRuns": [[60_000 * k, k, False] for k in range(LAST_RUNS)]}}
                 for i in range(count)])
    file.append([{"delete": [TOPIC, "s00001"], "stale": None}, {"put": row("s00001", version=2)}])
    file.close()
    size = os.path.getsize(path)
    gc.collect()
    tracemalloc.start()
    try:
        again = ScheduleFile(path, fsync=False)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert (held - size) / count < MAX_OPEN_BYTES_PER_SCHEDULE, (held - size) / count
    assert len(again.rows) == count
    assert again.rows[(TOPIC, "s00000")]["lastRuns"] == [[60_000 * k, k, False] for k in range(LAST_RUNS)]
    assert (again.rows[(TOPIC, "s00001")]["version"], again.rows[(TOPIC, "s00001")]["lastRuns"]) == (2, [])
    rows = list(again.rows.values())
    again.rows.clear()
    assert len(again.rows) == 0 and len(rows) == count
    again.close()


def test_a_run_of_a_version_the_file_does_not_hold_is_corruption(tmp_path: Any) -> None:
    path = str(tmp_path / "schedules")
    file = ScheduleFile(path, fsync=False)
    file.append([{"put": row("a", version=2)}, {"runs": [[TOPIC, "a", 1, 120_000, 2, 0, 60_000, 0, False]]},
                 {"put": row("b")}])
    file.close()
    with pytest.raises(CorruptionError, match="not the schedule's"):
        ScheduleFile(path, fsync=False)


def test_a_version_1_file_is_read_and_rewritten_as_version_2(tmp_path: Any) -> None:
    path = str(tmp_path / "schedules")
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, 1, 0) + frame({"put": row("a")}) + frame({"put": row("b")})
                + frame({"delete": [TOPIC, "b"], "stale": "s00000@60000"}))
    file = ScheduleFile(path, fsync=False)
    assert list(file.rows) == [(TOPIC, "a")] and file.stale == {(TOPIC, "b"): "s00000@60000"}
    file.append([{"runs": [[TOPIC, "a", 1, 120_000, 2, 0, 60_000, 3, False]]}])
    file.close()
    with open(path, "rb") as f:
        assert struct.unpack_from("<4sH", f.read(6)) == (MAGIC, 2)
    again = ScheduleFile(path, fsync=False)
    assert again.rows[(TOPIC, "a")]["lastRuns"] == [[60_000, 3, False]]
    assert again.stale == {(TOPIC, "b"): "s00000@60000"}
    again.close()
    with open(path, "r+b") as f:
        f.write(HEADER.pack(MAGIC, 3, 0))
    with pytest.raises(NewerFormatError, match=r"written by a newer hourglass \(format 3; this one reads 2\)"):
        ScheduleFile(path, fsync=False)


def test_a_rewrite_keeps_the_live_rows_alone(tmp_path: Any) -> None:
    path = str(tmp_path / "schedules")
    file = ScheduleFile(path, fsync=False)
    file.append([{"put": row(f"x{i}")} for i in range(2500)])
    file.append([{"delete": [TOPIC, f"x{i}"], "stale": None} for i in range(0, 2500, 2)])

    class Live:
        def __init__(self, r: dict[str, object]) -> None:
            self._row = r

        def row(self) -> dict[str, object]:
            return self._row

    live = [Live(row(f"x{i}")) for i in range(1, 2500, 2)]
    asyncio.run(file.rewrite(live))  # type: ignore[arg-type]
    assert file.size_bytes == os.path.getsize(path) and not os.path.exists(path + ".tmp")
    file.close()
    again = ScheduleFile(path, fsync=False)
    assert sorted(again.rows) == sorted((TOPIC, f"x{i}") for i in range(1, 2500, 2))
    again.close()


def test_a_restart_a_day_behind_follows_each_schedule_without_walking_its_missed_runs(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every-second cron schedules left a day behind: following each one's
    late run counted the runs it missed one cron time at a time (up to
    10,000 a schedule, on the loop: 60 such schedules kept a node from being
    healthy for 14 s). Now each is followed in a few next-time calls, the
    day's 86,400 missed runs counted by arithmetic."""
    count = 40
    node.put(count, cron="* * * * * *")
    pending = node.schedules.get(TOPIC, "s00000").pending
    assert pending is not None
    node.h.run(node.schedules.stop())
    node.schedules.close()
    node.h.close_broker()
    node.h.clock.set(pending + 24 * 3_600_000 + 500)  # down for a day
    calls: list[int] = []
    real = broker.core.recurrence._cron_at_or_after

    def counted(*args: Any) -> int | None:
        calls.append(1)
        return real(*args)
    monkeypatch.setattr(broker.core.recurrence, "_cron_at_or_after", counted)
    node.h.open_broker()
    node.schedules = node._schedules()
    node.advance_to(node.h.clock.now_ms() + 200)
    for i in range(count):
        state = node.schedules.get(TOPIC, f"s{i:05d}")
        assert state.last_runs[-1][0] == pending and state.last_runs[-1][2] is True  # released late: missed
        assert state.missed == 1 + 24 * 3600  # itself and the day's runs never made
        assert state.pending == pending + 24 * 3600 * 1000 + 1000  # the first after now
    assert len(calls) <= 3 * count, len(calls)


def test_a_rewrite_a_write_brings_due_keeps_the_puts_and_deletes_it_follows(node: Node) -> None:
    """A write that brought the schedules file's rewrite due rewrote it from
    the states RAM held before the change it wrote: 3,000 puts made
    together (a 2.3 MB write, past the 1 MiB floor) left a file of none of
    them (answered, then gone at the restart), and a delete left the
    deleted schedule in the file (back at the restart)."""
    async def put_all(count: int, msg: str) -> None:
        await asyncio.gather(*(node.schedules.put(dataclasses.replace(spec(i), msg=msg), None)
                               for i in range(count)))
    node.h.run(put_all(3000, "m" * 500))
    node.restart()
    assert len(node.schedules) == 3000
    # deletes shrink what is live until one brings the rewrite due: it keeps that one deleted too
    async def delete_all(count: int) -> None:
        for i in range(count):
            await node.schedules.delete(TOPIC, f"s{i:05d}")
    node.h.run(delete_all(2990))
    node.restart()
    assert sorted(s.spec.schedule_id for s in node.schedules.states()) == [f"s{i:05d}" for i in range(2990, 3000)]
def test_a_purge_of_many_pending_runs_is_followed_in_slices_and_every_schedule_goes_on(node: Node) -> None:
    count = 2 * ADVANCE_SLICE + 50
    node.put(count)
    first = (START_MS // MINUTE_MS + 1) * MINUTE_MS
    node.sends.clear()
    broker = node.h.broker
    assert broker is not None
    deleted, more = node.call(broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), count)))
    assert (deleted, more) == (count, False)
    assert node.schedules.runs_deleted == count and node.schedules.run_conflicts == 0
    # the next runs: one write and one send a slice (the delete's own slices, DELETE_SLICE, let the worker in)
    assert sum(node.sends) == count and max(node.sends) <= ADVANCE_SLICE and len(node.sends) <= 4, node.sends
    for i in range(count):
        state = node.schedules.get(TOPIC, f"s{i:05d}")
        assert (state.pending, state.runs, state.last_runs) == (first + MINUTE_MS, 2, [])
    node.advance_to(first + MINUTE_MS - 1)
    assert node.drain() == []  # the deleted runs never, the next ones not early
    node.advance_to(first + MINUTE_MS)
    assert sorted(node.drain()) == sorted(f"s{i:05d}@{first + MINUTE_MS}" for i in range(count))
    node.restart()  # what was recorded reads back: no run of `first` made again, nothing late
    node.advance_to(first + 2 * MINUTE_MS)
    assert sorted(node.drain()) == sorted(f"s{i:05d}@{first + 2 * MINUTE_MS}" for i in range(count))


def test_a_pending_run_deleted_with_no_one_told_is_seen_by_its_check(node: Node) -> None:
    node.put(1)
    first = (START_MS // MINUTE_MS + 1) * MINUTE_MS
    broker = node.h.broker
    assert broker is not None
    broker.on_cancel = None  # a path that tells the schedules nothing
    node.call(broker.delete(DeleteRequest(TOPIC, f"s00000@{first}", False)))
    assert node.schedules.get(TOPIC, "s00000").pending == first
    node.advance_to(first + CHECK_AFTER_MS - 1)
    assert node.schedules.get(TOPIC, "s00000").pending == first
    node.advance_to(first + CHECK_AFTER_MS)
    state = node.schedules.get(TOPIC, "s00000")
    assert (state.pending, state.runs) == (first + MINUTE_MS, 2) and node.schedules.runs_deleted == 1
    assert node.drain() == []
    node.advance_to(first + MINUTE_MS)
    assert node.drain() == [f"s00000@{first + MINUTE_MS}"]


def test_a_run_id_held_by_a_message_the_schedule_did_not_make_is_a_conflict_not_a_wait(node: Node) -> None:
    first = (START_MS // MINUTE_MS + 1) * MINUTE_MS
    broker = node.h.broker
    assert broker is not None
    node.h.run(broker.send([NewMessage(TOPIC, f"s00000@{first}", "mine", START_MS, first + 10 * MINUTE_MS,
                                       3_600_000, 3, 0, "", "")]))
    node.put(1)
    node.advance_to(node.h.clock.now_ms())
    state = node.schedules.get(TOPIC, "s00000")
    assert (state.pending, node.schedules.run_conflicts, node.schedules.runs_deleted) == (first + MINUTE_MS, 1, 0)
    node.advance_to(first + MINUTE_MS)
    assert node.drain() == [f"s00000@{first + MINUTE_MS}"]  # the run after it, on time
    held = node.h.run(broker.get(TOPIC, f"s00000@{first}"))
    assert (held.status, held.msg) == (Status.WAITING, "mine")  # the client's, as sent


def test_a_pending_run_acked_before_its_time_is_followed_as_released(node: Node) -> None:
    node.put(1)
    first = (START_MS // MINUTE_MS + 1) * MINUTE_MS
    broker = node.h.broker
    assert broker is not None
    assert node.call(broker.ack_many(TOPIC, [f"s00000@{first}"])) == [Status.ACKED]
    state = node.schedules.get(TOPIC, "s00000")
    assert (state.pending, state.runs, [r[0] for r in state.last_runs]) == (first + MINUTE_MS, 2, [first])
    node.advance_to(first + MINUTE_MS)
    assert node.drain() == [f"s00000@{first + MINUTE_MS}"]


def test_the_checks_of_runs_no_longer_pending_are_dropped_in_time(node: Node) -> None:
    """Each run sent leaves a check until its time (a year ahead here);
    puts of the same schedule leave those of runs no longer pending, which
    are dropped once twice the live ones' number plus CHECK_SLICE were added
    far ahead."""
    yearly = spec(0, cron="0 0 1 1 *")
    for _ in range(CHECK_SLICE + 200):
        node.h.run(node.schedules.put(yearly, None))
    checks = node.schedules._checks  # (white box: the checks themselves)
    assert len(checks) <= 2 + CHECK_SLICE
    state = node.schedules.get(TOPIC, "s00000")
    assert state.version == CHECK_SLICE + 200
    assert (state.key, state.pending) in checks.take_due(state.pending + 10 * MINUTE_MS, len(checks))  # the live one kept


def test_a_release_met_by_a_failing_repair_is_followed_once_the_failure_passes(node: Node) -> None:
    """Writes of the runs' progress fail for a while (a disk error, a Raft
    write no majority committed): the earlier schedule's release leaves it
    to the repair; the later one's release then meets that repair failing
    again. It is held back and followed once writes work again (it was
    dropped, and its schedule waited for a restart)."""
    node.h.run(node.schedules.put(spec(0), None))
    node.h.run(node.schedules.put(spec(1, "30 * * * * *"), None))
    node.h.run(node.h.quiesce())
    (early, early_ms), (late, late_ms) = sorted(
        ((sid, node.schedules.get(TOPIC, sid).pending or 0) for sid in ("s00000", "s00001")), key=lambda r: r[1])
    assert early_ms < late_ms < early_ms + MINUTE_MS
    file = node.schedules._file  # (white box: the file's writes, failing for a while)
    write_runs, write = file.write_runs, file.write
    failing = [True]

    async def failing_write_runs(states: Any) -> None:
        if failing[0]:
            raise OSError("disk error (test)")
        await write_runs(states)

    async def failing_write(records: Any) -> None:
        if failing[0]:
            raise OSError("disk error (test)")
        await write(records)
    file.write_runs, file.write = failing_write_runs, failing_write  # type: ignore[method-assign]
    node.advance_to(early_ms)
    node.advance_to(late_ms + CHECK_AFTER_MS + 1000)  # the late one released, and its check due, while writes fail
    failing[0] = False
    node.advance_to(late_ms + CHECK_AFTER_MS + 1000 + int(3 * REPAIR_INTERVAL_S * 1000))
    pending = {sid: node.schedules.get(TOPIC, sid).pending for sid in (early, late)}
    assert pending == {early: early_ms + MINUTE_MS, late: late_ms + MINUTE_MS}
    assert sorted(node.drain()) == sorted([f"{early}@{early_ms}", f"{late}@{late_ms}"])
    node.advance_to(late_ms + MINUTE_MS)
    assert sorted(node.drain()) == sorted([f"{early}@{early_ms + MINUTE_MS}", f"{late}@{late_ms + MINUTE_MS}"])


def test_a_pending_run_due_for_its_check_is_found_behind_thousands_of_stale_checks(node: Node) -> None:
    """The worker takes the checks due CHECK_SLICE at a time, passing over
    those of runs no longer pending: a pending run's check due behind
    3 x CHECK_SLICE stale ones is looked at, and the stale ones are gone."""
    node.put(1)
    state = node.schedules.get(TOPIC, "s00000")
    now_ms = node.h.clock.now_ms()
    checks = node.schedules._checks  # (white box: the checks themselves)
    checks.add(now_ms, state.key, state.pending, now_ms)
    for i in range(3 * CHECK_SLICE):
        checks.add(now_ms, (TOPIC, f"gone{i}"), i, now_ms)  # no such schedule: stale
    looked = [run for _ in range(3) for run in node.schedules._due_checks()]
    assert looked == [(state.key, state.pending)]
    due_ms = checks.due_ms()
    assert due_ms is not None and due_ms > now_ms  # what is left: the run's own check, at its time
