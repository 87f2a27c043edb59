"""InMemoryStore: the reference model of `storage.store.Store`.

Plain dicts and lists, no files, no hashing tricks: slow and obviously
right, so a test can drive it and the disk engine with the same calls and
demand that they agree (tests/property/test_store_model.py). It takes the
same valid inputs as `Store`; input validation beyond "is there a message
at this location" is the disk engine's business and is not modelled.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from storage import spans
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, SECONDS_PER_HOUR, IndexEntry, Location, Message, Status, hour_and_second
from storage.errors import InvalidRequest, StoreClosedError
from storage.types import (
    MAX_RETRY_COUNT,
    CheckpointReport,
    NewMessage,
    SendOutcome,
    SendResult,
    StateChange,
    text_hash,
    total_counts,
)

FINAL = Status.ACKED  # this and the statuses above it are final: acked, expired, ended, deleted


@dataclass
class _Filed:
    """One message as filed: what it is, where it sits, and its state."""

    new: NewMessage
    hour: int
    second: int
    local_index: int
    global_index: int
    pre_global_index: int
    status: Status = Status.WAITING
    retry: int = 0
    released: bool = False

    def entry(self) -> IndexEntry:
        m = self.new
        return IndexEntry(self.hour, self.second, self.local_index, self.global_index, self.pre_global_index,
                          m.trigger_ms, m.priority, text_hash(m.topic), text_hash(m.tag), self.status, self.retry)

    def message(self) -> Message:
        m = self.new
        return Message(m.topic, m.msg_id, m.msg, m.produce_ms, m.trigger_ms, m.ttl_ms, m.max_retry, m.priority,
                       m.tag, self.status, self.retry, Location(self.hour, self.global_index), m.key,
                       m.traceparent, m.tracestate, fair_key=m.fair_key)


class _State:
    """Everything a store holds after some prefix of its log."""

    def __init__(self) -> None:
        self.hours: dict[int, list[_Filed]] = {}  # hour -> its messages, index = globalIndex
        self.last_end_ms: dict[int, int] = {}  # hour -> latest now_ms that ended one of its messages
        self.ids: dict[tuple[str, str], Location] = {}  # (topic, msgId) of unreleased messages

    def at(self, where: Location) -> _Filed:
        filed = self.hours.get(where.hour, [])
        if not 0 <= where.global_index < len(filed):
            raise InvalidRequest("location", f"no message at {where}")
        return filed[where.global_index]

    def get(self, topic: str, msg_id: str) -> Message | None:
        where = self.ids.get((topic, msg_id))
        return None if where is None else self.at(where).message()

    def send(self, batch: Sequence[NewMessage], now_ms: int) -> list[SendResult]:
        results = []
        for m in batch:
            existing = self.get(m.topic, m.msg_id)
            if existing is not None:
                results.append(SendResult(SendOutcome.DUPLICATE, existing))
                continue
            hour, second = hour_and_second(max(m.trigger_ms, now_ms))
            hour = spans.file_for(hour, now_ms // MS_PER_HOUR)  # an hour, or a span far out
            filed = self.hours.setdefault(hour, [])
            same_second = [f for f in filed if f.second == second]
            pre = same_second[-1].global_index if same_second else -1
            f = _Filed(m, hour, second, len(same_second), len(filed), pre)
            filed.append(f)
            self.ids[(m.topic, m.msg_id)] = Location(hour, f.global_index)
            results.append(SendResult(SendOutcome.STORED, f.message()))
        return results

    def update(self, changes: Sequence[StateChange], now_ms: int) -> None:
        for change in changes:
            f = self.at(change.location)
            if change.status >= FINAL and not f.status >= FINAL:
                self.last_end_ms[f.hour] = max(self.last_end_ms.get(f.hour, 0), now_ms)
            f.status, f.retry = Status(change.status), change.retry
            if change.released and not f.released:
                f.released = True
                del self.ids[(f.new.topic, f.new.msg_id)]

    def ended(self, hour: int) -> int:
        return sum(f.status >= FINAL for f in self.hours.get(hour, []))

    def retire(self, now_ms: int, retention_ms: int) -> tuple[int, ...]:
        def past(hour: int, filed: list[_Filed]) -> bool:  # nothing can be filed in it any more
            if spans.is_span(hour):
                return spans.is_due(hour, spans.start_hour(hour, filed[0].new.trigger_ms), now_ms // MS_PER_HOUR)
            return (hour + 1) * MS_PER_HOUR <= now_ms

        retired = tuple(hour for hour, filed in sorted(self.hours.items())
                        if self.ended(hour) == len(filed) and past(hour, filed)
                        and self.last_end_ms[hour] + retention_ms <= now_ms)
        for hour in retired:
            del self.hours[hour]
            self.last_end_ms.pop(hour, None)
        self.ids = {key: where for key, where in self.ids.items() if where.hour not in retired}
        return retired


class InMemoryStore:
    """Reference model: a dict (topic, msgId) -> message plus, per hour, the
    list of its messages in arrival order; changes are pending until commit().

    Two states are kept: `_durable` (every committed change applied) and
    `_live` (pending changes applied too). As in `Store`, lookups by id and
    location see the live state; read_second and second_counts see only
    committed changes. `crash(k)` forgets pending changes except the first
    `k` records, which a torn commit-log tail may have kept.
    """

    def __init__(self, config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig()
        self._durable = _State()
        self._live = _State()
        # ("send", [NewMessage]) or ("update", [StateChange]), and now_ms: one log record each
        self._pending: list[tuple[str, list[NewMessage] | list[StateChange], int]] = []
        self._committed_records = 0
        self._closed = False

    # -- writing -------------------------------------------------------------------

    def send(self, batch: Sequence[NewMessage], now_ms: int) -> list[SendResult]:
        self._check_open()
        results = self._live.send(batch, now_ms)
        if any(r.outcome is SendOutcome.STORED for r in results):
            self._pending.append(("send", list(batch), now_ms))
        return results

    def update(self, changes: Iterable[StateChange], now_ms: int) -> None:
        self._check_open()
        changes = list(changes)
        for change in changes:  # all or nothing
            self._live.at(change.location)
            if not 0 <= change.retry <= MAX_RETRY_COUNT:
                raise InvalidRequest("retry", f"must be in 0..{MAX_RETRY_COUNT}, got {change.retry}")
        self._live.update(changes, now_ms)
        if changes:
            self._pending.append(("update", changes, now_ms))

    def commit(self) -> list[IndexEntry]:
        self._check_open()
        return self._apply_pending(len(self._pending))

    def _apply_pending(self, count: int) -> list[IndexEntry]:
        new_entries = []
        for kind, items, now_ms in self._pending[:count]:
            if kind == "send":
                for result in self._durable.send(cast(list[NewMessage], items), now_ms):
                    if result.outcome is SendOutcome.STORED:
                        new_entries.append(self._durable.at(result.message.location).entry())
            else:
                self._durable.update(cast(list[StateChange], items), now_ms)
        self._committed_records += count
        self._pending = []
        return new_entries

    def crash(self, surviving_records: int) -> None:
        """Model a kill -9 and reopen: the first `surviving_records` pending
        records reached the log whole, the rest are lost."""
        self._apply_pending(surviving_records)
        self._live = copy.deepcopy(self._durable)
        self._closed = False

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    def locations(self, committed: bool = False) -> list[Location]:
        """Every message's location (released ones included), in the live
        state or, with `committed`, in the committed one."""
        state = self._durable if committed else self._live
        return [Location(hour, gi) for hour, filed in sorted(state.hours.items()) for gi in range(len(filed))]

    # -- reading -------------------------------------------------------------------

    def get(self, topic: str, msg_id: str) -> Message | None:
        self._check_open()
        return self._live.get(topic, msg_id)

    def read_entry(self, where: Location) -> IndexEntry:
        return self._live.at(where).entry()

    def read_message(self, where: Location) -> Message | None:
        f = self._live.at(where)
        return None if f.released else f.message()

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        self._check_open()
        return [f.entry() for f in self._durable.hours.get(hour, []) if f.second == second]

    def second_counts(self, hour: int) -> Sequence[int]:
        counts = [0] * SECONDS_PER_HOUR
        for f in self._durable.hours.get(hour, []):
            counts[f.second] += 1
        return counts

    def next_hour(self, from_hour: int) -> int | None:
        return min((hour for hour in self._live.hours if hour >= from_hour and not spans.is_span(hour)), default=None)

    def hours(self) -> list[tuple[int, int, int]]:
        """(hour, entries, ended): entries counts pending sends, ended only
        committed changes, as in `Store`."""
        return [(hour, len(filed), self._durable.ended(hour)) for hour, filed in sorted(self._live.hours.items())]

    # -- per-topic counts (committed changes only, as in `Store`) ---------------------

    def topic_names(self) -> dict[int, str]:
        return {text_hash(f.new.topic): f.new.topic for filed in self._durable.hours.values() for f in filed}

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]:
        out = []
        for hour, filed in sorted(self._durable.hours.items()):
            counts = [0] * 8
            for f in filed:
                if text_hash(f.new.topic) == topic_hash:
                    counts[f.status] += 1
            if any(counts):
                out.append((hour, counts))
        return out

    def topic_counts(self, topic_hash: int) -> list[int]:
        return total_counts(self.topic_hours(topic_hash))

    def topic_count(self) -> int:
        return len(self.topic_names())

    def hour_topic_counts(self) -> Iterator[list[tuple[int, list[int]]]]:
        for _, filed in sorted(self._durable.hours.items()):
            counts: dict[int, list[int]] = {}
            for f in filed:
                counts.setdefault(text_hash(f.new.topic), [0] * 8)[f.status] += 1
            yield list(counts.items())

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]:
        self._check_open()
        filed = self._durable.hours.get(hour, [])
        filed = filed[first:] if count is None else filed[first:first + count]
        return [self._live.at(Location(hour, f.global_index)).entry() for f in filed]

    # -- checkpoint, time, close -----------------------------------------------------

    def checkpoint(self, now_ms: int) -> CheckpointReport:
        """Commit, then retire hours as `Store` does. `commit_offset` counts
        records here, not bytes, so only `hours_retired` compares."""
        self.commit()
        retired = self._durable.retire(now_ms, self.config.retention_ms)
        self._live = copy.deepcopy(self._durable)
        return CheckpointReport(self._committed_records, 0, retired)

    def advance(self, now_ms: int) -> None:
        self._check_open()

    def close(self) -> None:
        if not self._closed:
            self.commit()
            self._closed = True

    def reopen(self) -> None:
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("in-memory store is closed")

    def __repr__(self) -> str:
        messages = sum(len(filed) for filed in self._live.hours.values())
        return (f"InMemoryStore(hours={len(self._live.hours)}, messages={messages}, "
                f"pending_records={len(self._pending)})")
