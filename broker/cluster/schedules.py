"""A cluster's recurring schedules (docs/api.md, "Recurring schedules"):
kept in the Raft group's replicated state (replication.election,
`set_schedules`), as the push subscriptions are, so a change answered is
on a majority and every node that comes to lead reads it. Only the leader
makes runs: it builds broker.schedules.keeper' `Schedules` over this store when
it starts leading (its claim committed: every entry an older leader
committed is applied here by then) and stops it when it stands down.

The Raft state holds, for each schedule, these entries, keyed by the JSON
of [kind, topic, scheduleId] (a part's key adds [version, index]):

    kind  value (JSON)                               written
    "s"   every parameter, version, paused; or,      when the version changes
          when longer than PART_BYTES, {"parts":     (put, pause, resume)
          n, "version": v} naming its parts
    "t"   part i of version v's "s" (raw bytes)      before the "s" naming them
    "p"   pending, runs, catchUp, lastRuns, stale    each change: a run made too
    "x"   the msgId of a deleted schedule's run,     at delete; removed once the
          to delete if still waiting                 next leader has deleted it

so a run made writes its progress (about 300 bytes), not the whole
schedule: the runs one batch made are one write (`write_runs`), their
"p" entries packed into commands as below. Every command carries at most COMMAND_BYTES of entries: pysyncobj
sends a follower its log in batches of BATCH_BYTES plus the entry that
crosses it (replication.raft_transport), so an entry of any size could make
a frame the transport refuses. A long "s" is therefore cut into parts,
each in a command of its own, sent before the command holding the "s"
that names them: Raft commits in order, so an "s" committed has its parts,
and the parts of the version it replaces are removed after it.

What a failover leaves is what a restart leaves on a standalone node
(broker.schedules.keeper): the next run recorded (committed) before its message
is sent, so the new leader finds each pending run either sent (waiting,
or released: it follows it) or not (it sends it, strict: made once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from replication.election import Election
from storage.errors import Unavailable

from ..schedules.file import Key, Row, RowError, RunProgress

# The fields of a row kept in its "p" entry; the others are in its "s" entry.
PROGRESS = ("pending", "runs", "catchUp", "lastRuns", "stale")
# The most one Raft command carries (its entries' keys and values): with
# BATCH_BYTES (8 KiB) before it, a batch stays under 11 KiB of commands,
# doubled at most by pickling, far under MAX_FRAME_BYTES on the wire.
COMMAND_BYTES = 3 * 1024
# An "s" longer than this is written in parts of this size.
PART_BYTES = 2 * 1024

Change = tuple[str, bytes | None]


def entry_key(kind: str, key: Key, *more: int) -> str:
    return orjson.dumps([kind, key[0], key[1], *more]).decode()


def not_committed(what: str) -> Unavailable:
    """What a change of the Raft group's state a majority did not commit in time answers."""
    return Unavailable(f"{what} did not reach a majority of the cluster in time; retry")


def pack(units: list[list[Change]]) -> list[list[Change]]:
    """`units` (each a group of changes that go in one command) packed in
    order into commands of at most COMMAND_BYTES (a unit larger alone in one)."""
    commands: list[list[Change]] = []
    size = 0
    for unit in units:
        weight = sum(len(k) + (0 if v is None else len(v)) for k, v in unit)
        if not commands or (size and size + weight > COMMAND_BYTES):
            commands.append([])
            size = 0
        commands[-1].extend(unit)
        size += weight
    return [command for command in commands if command]


class RaftScheduleStore:
    """broker.schedules.keeper' ScheduleStore over the Raft group's state."""

    def __init__(self, election: Election) -> None:
        self._election = election
        specs: dict[Key, Row] = {}
        progress: dict[Key, Row] = {}
        parts: dict[tuple[Key, int, int], bytes] = {}
        self.stale: dict[Key, str] = {}
        for raw_key, value in election.schedules().items():
            kind, topic, schedule_id, *more = orjson.loads(raw_key)
            key = (str(topic), str(schedule_id))
            if kind == "s":
                specs[key] = orjson.loads(value)
            elif kind == "t":
                parts[(key, int(more[0]), int(more[1]))] = value
            elif kind == "p":
                progress[key] = orjson.loads(value)
            elif kind == "x":
                self.stale[key] = value.decode()
            elif kind == "j":
                continue  # a redriveMsgs job's record (broker.cluster.records)
            else:
                raise RowError(f"a schedules entry of unknown kind {kind!r}")
        self.commands = 0  # Raft commands sent (tests)
        # the (version, parts) each schedule's "s" entry holds now
        self._written: dict[Key, tuple[object, int]] = {}
        self.rows: dict[Key, Row] = {}
        for key, spec in specs.items():
            count = spec.get("parts")
            if isinstance(count, int):
                version = spec["version"]
                assert isinstance(version, int)
                spec = orjson.loads(b"".join(parts[(key, version, i)] for i in range(count)))
            self._written[key] = (spec.get("version"), count if isinstance(count, int) else 0)
            self.rows[key] = {**spec, "pending": None, "runs": 0, "catchUp": 0, "lastRuns": [], "stale": None,
                              **progress.get(key, {})}

    def __repr__(self) -> str:
        return f"RaftScheduleStore({len(self._written)} schedules)"

    def _units(self, record: Row) -> list[list[Change]]:
        """A record's changes, in groups each of which goes in one command, in order."""
        row = record.get("put")
        if isinstance(row, dict):
            key = (str(row["topic"]), str(row["scheduleId"]))
            version = row["version"]
            assert isinstance(version, int)  # a row broker.schedules.keeper made
            main: list[Change] = []
            before: list[list[Change]] = []
            after: list[list[Change]] = []
            written = self._written.get(key)
            if written is None or written[0] != version:
                spec = orjson.dumps({k: v for k, v in row.items() if k not in PROGRESS})
                if len(spec) <= PART_BYTES:
                    main.append((entry_key("s", key), spec))
                else:
                    pieces = [spec[i:i + PART_BYTES] for i in range(0, len(spec), PART_BYTES)]
                    before = [[(entry_key("t", key, version, i), piece)] for i, piece in enumerate(pieces)]
                    main.append((entry_key("s", key), orjson.dumps({"parts": len(pieces), "version": version})))
                main.append((entry_key("x", key), None))
                after = self._drop_parts(key)
            main.append((entry_key("p", key), orjson.dumps({k: row[k] for k in PROGRESS})))
            return [*before, main, *after]
        deleted = record["delete"]
        assert isinstance(deleted, list)  # a record broker.schedules.keeper made
        key = (str(deleted[0]), str(deleted[1]))
        stale = record.get("stale")
        return [[(entry_key("s", key), None), (entry_key("p", key), None),
                 (entry_key("x", key), stale.encode() if isinstance(stale, str) else None)], *self._drop_parts(key)]

    def _drop_parts(self, key: Key) -> list[list[Change]]:
        """The removal of the parts of the "s" entry written before (if it had parts)."""
        written = self._written.get(key)
        if written is None or not written[1] or not isinstance(written[0], int):
            return []
        return [[(entry_key("t", key, written[0], i), None)] for i in range(written[1])]

    async def write(self, records: list[Row]) -> None:
        """The records committed by a majority; Unavailable if not in time."""
        units = []
        for record in records:
            units.extend(self._units(record))
            self._note(record)
        await self._commit_or_forget(units, records)

    async def write_runs(self, states: Sequence[RunProgress]) -> None:
        """Runs made: each schedule's "p" entry (its whole row if its "s"
        entry may not be the version's), in one write."""
        units: list[list[Change]] = []
        records: list[Row] = []
        for s in states:
            written = self._written.get(s.key)
            if written is not None and written[0] == s.version:
                units.append([(entry_key("p", s.key), orjson.dumps(s.progress()))])
            else:
                record: Row = {"put": s.row()}
                units.extend(self._units(record))
                self._note(record)
                records.append(record)
        await self._commit_or_forget(units, records)

    async def _commit_or_forget(self, units: list[list[Change]], records: list[Row]) -> None:
        if not await self._commit(units):
            for record in records:  # unsure what is written: each "s" is written again next time
                row = record.get("put")
                if isinstance(row, dict):
                    self._written.pop((str(row["topic"]), str(row["scheduleId"])), None)
            raise not_committed("a schedules change")

    async def _commit(self, units: list[list[Change]]) -> bool:
        """The units packed into commands (`pack`), sent in order; True once
        a majority committed every one."""
        commands = pack(units)
        self.commands += len(commands)
        return all(await asyncio.gather(*(self._election.set_schedules(c) for c in commands)))

    def _note(self, record: Row) -> None:
        row = record.get("put")
        if isinstance(row, dict):
            key = (str(row["topic"]), str(row["scheduleId"]))
            written = self._written.get(key)
            if written is None or written[0] != row["version"]:
                spec_bytes = len(orjson.dumps({k: v for k, v in row.items() if k not in PROGRESS}))
                parts = 0 if spec_bytes <= PART_BYTES else -(-spec_bytes // PART_BYTES)
                self._written[key] = (row["version"], parts)
            return
        deleted = record["delete"]
        assert isinstance(deleted, list)
        self._written.pop((str(deleted[0]), str(deleted[1])), None)

    def rewrite_due(self, live_bytes: int) -> bool:
        return False  # pysyncobj compacts its own log

    async def rewrite(self, rows: Sequence[RunProgress]) -> None:
        return None

    async def forget_stale(self, keys: list[Key]) -> None:
        if not await self._commit([[(entry_key("x", key), None)] for key in keys]):
            raise not_committed("a schedules change")

    async def read(self, keys: Sequence[Key]) -> None:
        return None  # this node alone writes them: RAM is current

    async def topic_ids(self, topic: str) -> None:
        return None

    def close(self) -> None:
        return None
