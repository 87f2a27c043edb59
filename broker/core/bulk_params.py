"""Parameters of the bulk calls (docs/api.md, "Bulk calls"): listMsg,
deleteMsgs, rescheduleMsgs, and redriveMsgs' job (`parse_redrive_msgs`:
docs/api.md, "Re-driving by filter") -- and what both backends share of them: the
filter a message is matched against, the page order and its cursor.

The parameters follow broker.core.params' rules (its helpers read every value):

    topic         required
    key           a message's key, exactly              \\
    tag           a message's tag, exactly               |  filters: several
    msgIdPrefix   msgId starts with it                   |  combine with AND
    status        comma list of 1..7 (default 1,2,3)     |
    triggerFrom   trigger time >= it (ms since epoch)    |
    triggerTo     trigger time < it                     /
    cursor        listMsg: where the previous page ended
    limit         listMsg: 1..MAX_LIST_PAGE (default 100); deleteMsgs and
                  rescheduleMsgs: 1..MAX_BULK (default DEFAULT_BULK)
    countOnly     listMsg: answer the count of matches instead of a page
    all           deleteMsgs, rescheduleMsgs: true to act with no filter
    shiftMillis | triggerTime | delayMillis    rescheduleMsgs: exactly one

A limit out of range is refused (400), not clamped: a bulk call that did
less than asked would be a surprise. So is an unknown status, a
triggerFrom not before triggerTo, a cursor no page answered, and a delete
or reschedule with neither a filter nor all=true; each names its
parameter, and nothing is changed.

Pages are ordered by (trigger time, msgId), compared as (int, str); the
cursor is "<trigger ms>:<msgId>" of a page's last message, the next page
starting after it. `PageKeeper` keeps the first `limit` matches past a
cursor out of any order of candidates, in O(limit) memory, so a backend
may scan in its own storage order. A page also ends at a byte budget
(--max-page-bytes, `answer_bytes` of its messages; at least one message),
with a cursor to go on: a client that asks for pages and does not read
them holds the node's memory to that much a page (docs/security.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from storage.entry import Location, Message, Status
from storage.errors import InvalidRequest

from .params import MAX_DEAD_PAGE, MAX_TRIGGER_MS, Params, WalkRequest, _bool, _int, _name, _required_name

# listMsg: messages a page holds at most.
MAX_LIST_PAGE = 1000
DEFAULT_LIST_PAGE = 100
# listMsg, listDeadMsg: bytes of messages a page holds at most by default
# (--max-page-bytes), as `answer_bytes` counts them; a page holds at least one.
DEFAULT_PAGE_BYTES = 4 * 1024 * 1024
# What a message's answer holds beside its texts: field names, numbers, quotes.
ANSWER_FIELDS_BYTES = 256
# deleteMsgs, rescheduleMsgs: messages one call changes by default and at most.
DEFAULT_BULK = 100_000
MAX_BULK = 1_000_000
# redriveMsgs: messages one job re-drives by default and at most, and its
# `rate` at most (a second; 0: as fast as slices go).
MAX_REDRIVE = 100_000_000
DEFAULT_REDRIVE = MAX_REDRIVE  # (all that match)
MAX_REDRIVE_RATE = 1_000_000

LIVE = frozenset((Status.WAITING, Status.READY, Status.CONSUMING))
MOVABLE = frozenset((Status.WAITING, Status.READY))
DEAD = frozenset((Status.EXPIRED, Status.ENDED))
# exportMsg's statuses unless asked: the live (1, 2, 3) and the dead (5, 6).
EXPORTED = LIVE | DEAD
# A walk's cursor is a shard and a place, or a Redis HSCAN cursor: far shorter.
MAX_CURSOR_CHARS = 100


class BulkFilter(NamedTuple):
    """What a message must be to match; None: any."""

    key: str | None = None
    tag: str | None = None
    msg_id_prefix: str | None = None
    statuses: frozenset[Status] = LIVE
    trigger_from_ms: int | None = None  # inclusive
    trigger_to_ms: int | None = None  # exclusive
    # messages left out, by place (a resume's shift or expire: the runs of
    # recurring schedules a pause held back, which their misfire rule decides)
    exclude: frozenset[Location] = frozenset()
    # False: those runs left out on the Redis backend too, where each one's
    # meta marks it held (broker.redis.bulk; lua/backend/common.lua's hold)
    held_runs: bool = True

    def needs_body(self) -> bool:
        """Whether matching needs more than a trigger time and a status
        (the key, the msgId or the tag's text)."""
        return self.key is not None or self.msg_id_prefix is not None or self.tag is not None

    def in_range(self, trigger_ms: int) -> bool:
        return ((self.trigger_from_ms is None or trigger_ms >= self.trigger_from_ms)
                and (self.trigger_to_ms is None or trigger_ms < self.trigger_to_ms))

    def matches(self, m: Message) -> bool:
        return (m.status in self.statuses and self.in_range(m.trigger_ms)
                and (self.key is None or m.key == self.key)
                and (self.tag is None or m.tag == self.tag)
                and (self.msg_id_prefix is None or m.msg_id.startswith(self.msg_id_prefix))
                and (not self.exclude or m.location not in self.exclude))

    def narrowed(self, statuses: frozenset[Status]) -> BulkFilter:
        """The same filter, its statuses cut to `statuses` (a delete acts on
        live messages only, a reschedule on waiting and ready ones)."""
        return self._replace(statuses=self.statuses & statuses)


class DeadFilter(NamedTuple):
    """What a dead letter must be to match a redriveMsgs job; None: any.
    `ended_*` compare its expireTime (triggerTime + ttlMillis): the end
    of its life, the time it ended by at the latest (an ended message
    keeps no other end time: docs/api.md, "Re-driving by filter")."""

    key: str | None = None
    tag: str | None = None
    msg_id_prefix: str | None = None
    statuses: frozenset[Status] = DEAD
    ended_from_ms: int | None = None  # inclusive
    ended_to_ms: int | None = None  # exclusive

    def matches(self, m: Message) -> bool:
        expire_ms = m.trigger_ms + m.ttl_ms
        return (m.status in self.statuses
                and (self.ended_from_ms is None or expire_ms >= self.ended_from_ms)
                and (self.ended_to_ms is None or expire_ms < self.ended_to_ms)
                and (self.key is None or m.key == self.key)
                and (self.tag is None or m.tag == self.tag)
                and (self.msg_id_prefix is None or m.msg_id.startswith(self.msg_id_prefix)))

    def fields(self) -> list[object]:
        """As JSON stores it (a job's record, a call between shards)."""
        return [self.key, self.tag, self.msg_id_prefix, sorted(int(s) for s in self.statuses), self.ended_from_ms,
                self.ended_to_ms]

    @classmethod
    def of(cls, fields: Sequence[object]) -> DeadFilter:
        """`fields()`' list again (a tuple, through a shard link)."""
        key, tag, prefix, statuses, lo, hi = fields
        if not isinstance(statuses, (list, tuple)) or not statuses or not {*statuses} <= {5, 6}:
            raise InvalidRequest("status", f"a dead-letter filter's statuses are 5 and 6, got {statuses!r}")
        return cls(_opt_str(key), _opt_str(tag), _opt_str(prefix), frozenset(Status(int(s)) for s in statuses),
                   _opt_int(lo), _opt_int(hi))


def _opt_str(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidRequest("filter", f"must be a string or null, got {value!r}")


def _opt_int(value: object) -> int | None:
    if value is None or (type(value) is int):
        return value
    raise InvalidRequest("filter", f"must be a whole number or null, got {value!r}")


# Where a redriveMsgs job's next slice starts (broker.jobs.runner): on disk
# a Location (file id, globalIndex) in the topic's index; on Redis (purge
# ms, msgId), a member of the topic's dead set (broker.redis.requests).
# (0, 0) on both: the start.
JobCursor = tuple[int, int | str]


class RedriveMsgsRequest(NamedTuple):
    """redriveMsgs: a job's parameters."""

    topic: str
    filter: DeadFilter
    trigger_ms: int | None  # every message's new trigger time; None: the time it is re-driven
    rate: int  # messages a second, 0: no pacing
    limit: int  # messages re-driven at most


class Cursor(NamedTuple):
    """Where a page ended: the next starts after (trigger_ms, msg_id)."""

    trigger_ms: int
    msg_id: str

    def text(self) -> str:
        return f"{self.trigger_ms}:{self.msg_id}"


class ListMsgRequest(NamedTuple):
    topic: str
    filter: BulkFilter
    cursor: Cursor | None
    limit: int
    count_only: bool
    max_bytes: int | None = None  # the page's byte budget (`answer_bytes`); None: none


class DeleteMsgsRequest(NamedTuple):
    topic: str
    filter: BulkFilter  # statuses already cut to the live ones
    limit: int


class RescheduleMsgsRequest(NamedTuple):
    topic: str
    filter: BulkFilter  # statuses already cut to waiting and ready
    limit: int
    shift_ms: int | None  # added to each trigger time; else:
    trigger_ms: int | None  # every message to this absolute time

    def new_trigger_ms(self, old_trigger_ms: int) -> int:
        """A message's trigger time after the move, within 0..MAX_TRIGGER_MS."""
        moved = old_trigger_ms + self.shift_ms if self.shift_ms is not None else self.trigger_ms
        assert moved is not None  # (one of them is set: parse_reschedule_msgs)
        return min(max(moved, 0), MAX_TRIGGER_MS)


def order_key(m: Message) -> tuple[int, str]:
    """A page's order: trigger time, then msgId."""
    return m.trigger_ms, m.msg_id


def answer_bytes(m: Message) -> int:
    """The bytes `m` takes in a page's JSON answer, about: its texts as
    JSON writes them (escapes included), and ANSWER_FIELDS_BYTES for the rest."""
    dumps = orjson.dumps
    return (len(dumps(m.msg)) + len(dumps(m.msg_id)) + len(dumps(m.topic)) + len(dumps(m.tag)) + len(dumps(m.key))
            + ANSWER_FIELDS_BYTES)


class PageKeeper:
    """The first candidates past `after` in page order, as many as fit in
    `limit` messages and `max_bytes` bytes of answer (`answer_bytes`; at
    least one message), from candidates offered in any order; memory
    O(limit) messages and O(max_bytes). `more` says a match beyond the page
    was offered, so the page gets a cursor.

    Why the page stays right: the kept set is always the longest prefix, in
    page order, of the candidates offered that fits both bounds. A new
    candidate is pushed and the last ones popped until it fits again. The
    first candidate ever popped in page order (`_cut`) did not fit behind
    the kept ones, and they only grow in front of it: no candidate ordered
    after it can enter any more, while one before it may (a small one can
    fit where a large one did not)."""

    def __init__(self, after: Cursor | None, limit: int, max_bytes: int | None = None) -> None:
        self._after = None if after is None else (after.trigger_ms, after.msg_id)
        self._limit = limit
        self._max_bytes = max_bytes
        self._bytes = 0  # answer bytes of the kept messages (counted only with max_bytes)
        # negated keys: a max-heap of the page; each with its answer bytes
        self._heap: list[tuple[int, _Desc, Message, int]] = []
        self._cut: tuple[int, str] | None = None  # the first candidate popped, in page order
        self.more = False

    def __repr__(self) -> str:
        return f"PageKeeper(limit={self._limit}, kept={len(self._heap)})"

    def worth(self, trigger_ms: int) -> bool:
        """Whether a candidate triggering at `trigger_ms` could enter the
        page (asked before its body is read)."""
        if self._after is not None and trigger_ms < self._after[0]:
            return False
        return self._cut is None or trigger_ms <= self._cut[0]

    def closed_before(self, low_ms: int) -> bool:
        """Whether nothing triggering at `low_ms` or later can change the
        page any more: it is full, a match beyond it was seen, and its last
        triggers before `low_ms` (asked before reading candidates whose
        trigger times are known to start there)."""
        return self.more and len(self._heap) >= self._limit and low_ms > -self._heap[0][0]

    def scan_range(self) -> tuple[int | None, int | None]:
        """The trigger times [low, high) a candidate may still have (None:
        unbounded): not before the cursor's; and once a match beyond the
        page was seen (`more`: the page gets its cursor), not after the page's
        last one nor after the first that did not fit. Until then the scan
        goes on, however full the page: a match beyond it must be seen for
        the page to say there is more."""
        low = None if self._after is None else self._after[0]
        if not self.more:
            return low, None
        high = None if self._cut is None else self._cut[0] + 1
        if len(self._heap) >= self._limit:
            last = -self._heap[0][0] + 1
            high = last if high is None else min(high, last)
        return low, high

    def before_cursor(self, high_ms: int) -> bool:
        """Whether every candidate triggering before `high_ms` lies before
        the cursor (so need not be read)."""
        return self._after is not None and high_ms <= self._after[0]

    def offer(self, m: Message) -> None:
        key = order_key(m)
        if self._after is not None and key <= self._after:
            return
        cut = self._cut
        if cut is not None and key > cut:
            return  # behind a candidate that did not fit
        heap, max_bytes = self._heap, self._max_bytes
        size = 0 if max_bytes is None else answer_bytes(m)
        heapq.heappush(heap, (-m.trigger_ms, _Desc(m.msg_id), m, size))
        self._bytes += size
        while len(heap) > self._limit or (max_bytes is not None and self._bytes > max_bytes and len(heap) > 1):
            negated, desc, _, popped_size = heapq.heappop(heap)
            self._bytes -= popped_size
            popped = (-negated, desc.text)
            if cut is None or popped < cut:
                cut = self._cut = popped
            self.more = True

    def page(self) -> tuple[list[Message], Cursor | None]:
        """The page, in order, and the cursor after it (None: the last page)."""
        page = sorted((m for _, _, m, _ in self._heap), key=order_key)
        if not self.more or not page:
            return page, None
        return page, Cursor(page[-1].trigger_ms, page[-1].msg_id)


class _Desc:
    """A msgId ordered backwards, for PageKeeper's max-heap."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Desc) -> bool:
        return self.text > other.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"_Desc({self.text!r})"


# ---------------------------------------------------------------- parsing

def parse_filter(params: Params) -> tuple[BulkFilter, bool]:
    """The filter, and whether any filter parameter was given."""
    key = _name("key", params.get("key"), no_nul=True)
    tag = _name("tag", params.get("tag"), no_comma=True)
    prefix = _name("msgIdPrefix", params.get("msgIdPrefix"), no_nul=True)
    statuses = _statuses(params.get("status"))
    lo = _time("triggerFrom", params.get("triggerFrom"))
    hi = _time("triggerTo", params.get("triggerTo"))
    if lo is not None and hi is not None and lo >= hi:
        raise InvalidRequest("triggerFrom", f"must be before triggerTo, got {lo} >= {hi}")
    given = any(v is not None for v in (key, tag, prefix, statuses, lo, hi))
    return BulkFilter(key, tag, prefix, LIVE if statuses is None else statuses, lo, hi), given


def parse_list_msg(params: Params, max_bytes: int | None = None) -> ListMsgRequest:
    """`max_bytes`: the page's byte budget (--max-page-bytes)."""
    topic = _required_name(params, "topic")
    flt, _ = parse_filter(params)
    return ListMsgRequest(topic, flt, parse_cursor(params.get("cursor")),
                          _limit(params, DEFAULT_LIST_PAGE, MAX_LIST_PAGE), _bool(params, "countOnly", default=False),
                          max_bytes)


def cut_page(page: list[Message], cursor: str | None, max_bytes: int) -> tuple[list[Message], str | None]:
    """A page (in page order) and its cursor, cut to the messages that fit
    in `max_bytes` (`answer_bytes`; at least one): what any backend's page
    is answered as."""
    size = 0
    for i, m in enumerate(page):
        size += answer_bytes(m)
        if size > max_bytes and i:
            return page[:i], Cursor(page[i - 1].trigger_ms, page[i - 1].msg_id).text()
    return page, cursor


def parse_export_msg(params: Params) -> WalkRequest:
    """exportMsg: `status`, a comma list of 1..7 (default EXPORTED: live and
    dead), `cursor` from the previous page, `limit` 1..MAX_DEAD_PAGE
    (default the most)."""
    topic = _required_name(params, "topic")
    statuses = _statuses(params.get("status"))
    cursor = params.get("cursor")
    if cursor in (None, ""):
        cursor = None
    elif not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidRequest("cursor", f"must be a cursor an exportMsg page answered, got {str(cursor)[:40]!r}")
    return WalkRequest(topic, EXPORTED if statuses is None else statuses, cursor,
                       _limit(params, MAX_DEAD_PAGE, MAX_DEAD_PAGE))


def parse_delete_msgs(params: Params) -> DeleteMsgsRequest:
    topic = _required_name(params, "topic")
    flt = _bulk_filter(params)
    return DeleteMsgsRequest(topic, flt.narrowed(LIVE), _limit(params, DEFAULT_BULK, MAX_BULK))


def parse_reschedule_msgs(params: Params, now_ms: int) -> RescheduleMsgsRequest:
    """shiftMillis (signed), triggerTime (absolute) or delayMillis (from
    `now_ms`): exactly one."""
    topic = _required_name(params, "topic")
    flt = _bulk_filter(params)
    limit = _limit(params, DEFAULT_BULK, MAX_BULK)
    shift_ms = _int("shiftMillis", params.get("shiftMillis"))
    trigger_ms = _time("triggerTime", params.get("triggerTime"))
    delay_ms = _int("delayMillis", params.get("delayMillis"))
    given = [name for name, v in (("shiftMillis", shift_ms), ("triggerTime", trigger_ms), ("delayMillis", delay_ms))
             if v is not None]
    if len(given) != 1:
        raise InvalidRequest("shiftMillis", "or triggerTime or delayMillis is required, exactly one"
                             + (f" (got {', '.join(given)})" if given else ""))
    if shift_ms is not None and abs(shift_ms) > MAX_TRIGGER_MS:
        raise InvalidRequest("shiftMillis", f"must be within +-{MAX_TRIGGER_MS}, got {shift_ms}")
    if delay_ms is not None:
        trigger_ms = now_ms + max(delay_ms, 0)
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest("delayMillis", f"puts the trigger time past {MAX_TRIGGER_MS} (year 9999)")
    return RescheduleMsgsRequest(topic, flt.narrowed(MOVABLE), limit, shift_ms, trigger_ms)


def parse_redrive_msgs(params: Params, now_ms: int) -> RedriveMsgsRequest:
    """redriveMsgs: topic; filters key, tag, msgIdPrefix, status (5, 6:
    a comma list, default both), endedFrom (incl.) < endedTo (excl.);
    at most one of delayMillis (from `now_ms`) and triggerTime (default:
    each message due when re-driven); rate (0..MAX_REDRIVE_RATE a second,
    0 none); limit (1..MAX_REDRIVE, default DEFAULT_REDRIVE). Refused
    whole, naming the parameter, on any bad one."""
    topic = _required_name(params, "topic")
    key = _name("key", params.get("key"), no_nul=True)
    tag = _name("tag", params.get("tag"), no_comma=True)
    prefix = _name("msgIdPrefix", params.get("msgIdPrefix"), no_nul=True)
    statuses = _statuses(params.get("status"))
    if statuses is not None and not statuses <= DEAD:
        raise InvalidRequest("status", f"must be 5, 6 or 5,6 (dead letters), got {str(params.get('status'))[:40]!r}")
    lo = _time("endedFrom", params.get("endedFrom"))
    hi = _time("endedTo", params.get("endedTo"))
    if lo is not None and hi is not None and lo >= hi:
        raise InvalidRequest("endedFrom", f"must be before endedTo, got {lo} >= {hi}")
    trigger_ms = _time("triggerTime", params.get("triggerTime"))
    delay_ms = _int("delayMillis", params.get("delayMillis"))
    if delay_ms is not None:
        if trigger_ms is not None:
            raise InvalidRequest("delayMillis", "or triggerTime, not both")
        trigger_ms = now_ms + max(delay_ms, 0)
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest("delayMillis", f"puts the trigger time past {MAX_TRIGGER_MS} (year 9999)")
    rate = _int("rate", params.get("rate"))
    if rate is not None and not 0 <= rate <= MAX_REDRIVE_RATE:
        raise InvalidRequest("rate", f"must be in 0..{MAX_REDRIVE_RATE} messages a second (0: no pacing), got {rate}")
    limit = _limit(params, DEFAULT_REDRIVE, MAX_REDRIVE)
    flt = DeadFilter(key, tag, prefix, DEAD if statuses is None else statuses, lo, hi)
    return RedriveMsgsRequest(topic, flt, trigger_ms, rate or 0, limit)


def parse_job_id(params: Params, required: bool = True) -> str | None:
    """getJob, cancelJob: `jobId` (getJob without it: the list)."""
    job_id = _name("jobId", params.get("jobId"), no_nul=True)
    if job_id is None and required:
        raise InvalidRequest("jobId", "is required")
    if job_id is not None and not (len(job_id) <= 64 and job_id.isascii() and job_id.replace("-", "").isalnum()):
        raise InvalidRequest("jobId", f"must be a jobId redriveMsgs answered, got {job_id[:40]!r}")
    return job_id


def parse_cursor(value: object) -> Cursor | None:
    """"<trigger ms>:<msgId>" as a page answered it; None when not given."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        ms, colon, msg_id = value.partition(":")
        if colon and msg_id and ms.isascii() and ms.isdigit() and len(ms) < 17 and "\0" not in msg_id:
            return Cursor(int(ms), msg_id)
    raise InvalidRequest("cursor", f"must be a cursor a listMsg page answered, got {str(value)[:40]!r}")


def _bulk_filter(params: Params) -> BulkFilter:
    flt, given = parse_filter(params)
    every = _bool(params, "all", default=False)
    if not given and not every:
        raise InvalidRequest("all", "a filter (key, tag, msgIdPrefix, status, triggerFrom, triggerTo) or all=true "
                             "is required")
    return flt


def _statuses(raw: object) -> frozenset[Status] | None:
    if raw is None or raw == "":
        return None
    parts = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else [raw]
    out = set()
    for part in parts:
        value = _int("status", part)
        if value is None or not 1 <= value <= 7:
            raise InvalidRequest("status", f"must be a comma list of statuses 1..7, got {str(raw)[:40]!r}")
        out.add(Status(value))
    return frozenset(out)


def _time(parameter: str, value: object) -> int | None:
    ms = _int(parameter, value)
    if ms is not None and not 0 <= ms <= MAX_TRIGGER_MS:
        raise InvalidRequest(parameter, f"must be in 0..{MAX_TRIGGER_MS} (ms since the epoch), got {ms}")
    return ms


def _limit(params: Params, default: int, maximum: int) -> int:
    limit = _int("limit", params.get("limit"))
    if limit is None:
        return default
    if not 1 <= limit <= maximum:
        raise InvalidRequest("limit", f"must be in 1..{maximum}, got {limit}")
    return limit
