"""The storage engine: commit log in, hourly delay logs and indexes out.

Layout of a data directory:

    checkpoint            commit offset + per-hour sizes (storage.checkpoint)
    commitlog/*.log       the commit log segments (storage.commit_log)
    delay/<id>.log        bodies of messages triggering in that UTC hour,
                          or in a span of hours (storage.spans)
    delay/<id>.idx        their index entries (storage.delay_index)
    delay/<id>.sec        the hour's second table (storage.second_table)
    ids/secret            the id index's hash key (storage.id_index)
    ids/<shard>.hix       (topic, msgId) -> location (storage.id_index)

How a change flows:

    send()/update()   assign coordinates (hour, globalIndex, preGlobalIndex,
                      localIndex, delay-log offset), append ONE record to the
                      commit log. Nothing derived is written yet; later calls
                      in the same batch see the change through small
                      "pending" overlays (dedup, second-table tails, status).
    commit()          fsync the log once for everything appended since the
                      last commit (group commit), then apply the records to
                      the derived files and return the new index entries.
    checkpoint()      flush every derived file, record the commit offset,
                      delete commit-log segments and hours no longer needed.

Derived files are never ahead of the durable log, and applying a record is a
set of writes at positions the record names; so recovery is: cut each hour
back to its checkpointed size, replay the log from the checkpoint's offset.

Time is a parameter (`now_ms`): the store never reads a clock. The hour of
`now_ms` and the next one are the "near" hours, memory-mapped; all others
are reached with pread/pwrite through a bounded cache of open files.
Messages more than 32 hours ahead are filed in coarser spans of hours, and
filed again (`refile()`) as their span comes near: storage.spans.

Concurrency: one thread calls everything, except that `sync_log()` may run
in a worker thread while that thread keeps appending.

`Store` is the one front door; its parts live in a module each, one
concern per module, stacked as base classes that share the state of the
first:

    storage.hour_table  the shared state, the hours and their file cache
    storage.applying    records into derived files; commit
    storage.reading     lookups, scans, per-topic counts
    storage.placement   send, update: coordinates assigned, and undone
    storage.refile      move, refile: filing messages again
    storage.recovery    open: repair from the commit log
    storage.retention   checkpoints, retiring hours and segments
    storage.types       the values callers pass and get back
"""

from __future__ import annotations

from .config import StoreConfig
from .errors import ContractError
from .recovery import Recovery
from .refile import Refiling
from .retention import Retention
from .types import (
    MAX_PRIORITY,
    MAX_RECORD_CHARS,
    MAX_RETRY_COUNT,
    MIN_PRIORITY,
    CheckpointReport,
    NewMessage,
    PreparedCheckpoint,
    SendOutcome,
    SendResult,
    StateChange,
    text_hash,
    total_counts,
)

__all__ = [
    "MAX_PRIORITY", "MAX_RECORD_CHARS", "MAX_RETRY_COUNT", "MIN_PRIORITY", "CheckpointReport", "NewMessage",
    "PreparedCheckpoint", "SendOutcome", "SendResult", "StateChange", "Store", "text_hash", "total_counts",
]


class Store(Recovery, Retention, Refiling):
    """The disk engine. See the module docstring for the flow of a change.

    Worked example (now = 10:00:00.000 UTC, hour h):
        send([m1 due 10:00:05.250, m2 due 12:30:00.000], now)
          m1 -> hour h,   second 5,    globalIndex 0, localIndex 0
          m2 -> hour h+2, second 1800, globalIndex 0, localIndex 0
        commit()                        # one fsync, then both applied
        read_second(h, 5)  -> [entry of m1]
        update([StateChange(m1.location, Status.ACKED, 0)], now); commit()

    Cost: send and update are O(1) per message plus one record append;
    commit is one fsync plus O(1) writes per message; read_second is O(the
    second's messages); memory is O(hours + pending batch), never O(backlog).
    """

    @classmethod
    def open(cls, directory: str, config: StoreConfig | None = None, now_ms: int | None = None) -> Store:
        """Open or create a store; repairs derived files from the commit log."""
        store = cls(directory, config or StoreConfig())
        try:
            store._recover()
        except BaseException:  # a refused directory keeps no descriptor open
            store._release_files()
            raise
        if now_ms is not None:
            store.advance(now_ms)
        return store

    # == replication ============================================================

    def append_replicated(self, offset: int, body: bytes) -> None:
        """A follower appends the leader's record found at `offset`, byte for
        byte, so both logs give it the same offset. Durable and applied by
        the next `commit()`, exactly as if this store had made it."""
        self._check_open()
        if offset != self.log_end_offset:
            raise ContractError(f"record at offset {offset} does not continue this log (it ends at {self.log_end_offset})")
        kind, now_ms, items = self._decode(body)
        self.log.append(body)
        self._pending.append((kind, now_ms, items))

    def read_log(self, offset: int, end_offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Records from `offset` (a record boundary) before `end_offset`, at
        least one and about `max_bytes` in all: what a follower fetches."""
        found: list[tuple[int, bytes]] = []
        size = 0
        for at, body in self.log.read_from(offset):
            if at >= end_offset or (found and size + len(body) > max_bytes):
                break
            found.append((at, body))
            size += len(body)
        return found

    def close(self) -> None:
        """Commit what is pending and close every file (no checkpoint: the
        next open replays from the last one)."""
        if self._closed:
            return
        self.commit()
        self._flush_staged(everything=True)
        for h in list(self._hours.values()):
            self._close_files(h)
        self.ids.close()
        self.log.close()
        self._closed = True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Store({self.directory!r}, hours={len(self._hours)}, log_end={self.log_end_offset}, "
                f"pending_records={len(self._pending)}, fsync={self.config.fsync.value})")
