"""The schedule endpoints' parameters, pure (docs/api.md, "Recurring
schedules"): validated whole before anything is stored, a refusal naming
the parameter (code 400).

    parse_put_schedule(params, ...)  -> (ScheduleSpec, version or None)
    parse_schedule_ref(params)       -> (topic, scheduleId): delete, pause, resume
    parse_get_schedule(params)       -> (topic, scheduleId, next)
    parse_list_schedules(params)     -> (topic, cursor, limit)

A `ScheduleSpec` is what a client put: every parameter, with the message
fields a run's message gets (`msg`, and ttlMillis, maxRetry, priority,
tag, key as sendMsg reads them, the node's defaults filled in).
"""

from __future__ import annotations

import sys
import zoneinfo
from dataclasses import dataclass

from storage.errors import InvalidRequest

from ..core.params import MAX_TRIGGER_MS, Defaults, Params, _int, _message, _name, _required_name, _text
from ..core.recurrence import MAX_SCHEDULE_ID_CHARS, Cron, Misfire, Recurrence, zone
from .file import RowError

# everyMillis: the shortest interval.
MIN_EVERY_MS = 1000
MAX_CRON_CHARS = 256
DEFAULT_GRACE_MS = 60_000
DEFAULT_MAX_CATCH_UP = 10
MAX_CATCH_UP = 1000
MAX_LIMIT = 10**12
# getSchedule's `next`, listSchedules' `limit`.
DEFAULT_NEXT = 5
MAX_NEXT = 100
DEFAULT_PAGE = 100
MAX_PAGE = 1000


# A text of a schedule at most this long is interned (`ScheduleSpec`): the
# topic, cron, zone, tag, key and msg many schedules repeat are held once.
SHARED_TEXT_CHARS = 4096


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One schedule as put (every field named as its parameter is). Its
    texts other than the scheduleId are interned (up to SHARED_TEXT_CHARS):
    each parsed put or read row brings its own copies, and 100,000
    schedules of one topic and msg would hold 100,000 of each."""

    topic: str
    schedule_id: str
    cron: str | None
    every_ms: int | None
    time_zone: str
    msg: str
    ttl_ms: int
    max_retry: int
    priority: int
    tag: str
    key: str
    start_ms: int
    end_ms: int | None
    limit: int | None
    jitter_ms: int
    misfire: Misfire
    grace_ms: int
    max_catch_up: int

    def __post_init__(self) -> None:
        for name in ("topic", "cron", "time_zone", "msg", "tag", "key"):
            text = getattr(self, name)
            if text is not None and len(text) <= SHARED_TEXT_CHARS:
                object.__setattr__(self, name, sys.intern(text))

    def recurrence(self) -> Recurrence:
        """Its time rules (the cron and zone were checked when it was parsed)."""
        return Recurrence(None if self.cron is None else Cron.parse(self.cron), self.every_ms,
                          zoneinfo.ZoneInfo(self.time_zone), self.start_ms, self.end_ms)

    def public(self) -> dict[str, object]:
        """Every parameter, by its name (the schedule's answer and the file's row)."""
        return {"topic": self.topic, "scheduleId": self.schedule_id, "cron": self.cron, "everyMillis": self.every_ms,
                "timeZone": self.time_zone, "msg": self.msg, "ttlMillis": self.ttl_ms, "maxRetry": self.max_retry,
                "priority": self.priority, "tag": self.tag, "key": self.key, "startTime": self.start_ms,
                "endTime": self.end_ms, "limit": self.limit, "jitterMillis": self.jitter_ms,
                "misfire": self.misfire.value, "misfireGraceMillis": self.grace_ms, "maxCatchUp": self.max_catch_up}

    @classmethod
    def from_public(cls, row: dict[str, object]) -> ScheduleSpec:
        """The inverse of `public` (broker.schedules.file reads rows back;
        a row that is not one raises RowError, KeyError or ValueError)."""
        def integer(name: str) -> int:
            value = row[name]
            if type(value) is not int:
                raise RowError(f"{name} is not a whole number: {value!r}")
            return value

        def optional(name: str) -> int | None:
            return None if row.get(name) is None else integer(name)

        def text(name: str) -> str:
            value = row[name]
            if not isinstance(value, str):
                raise RowError(f"{name} is not a string: {value!r}")
            return value

        return cls(text("topic"), text("scheduleId"), None if row.get("cron") is None else text("cron"),
                   optional("everyMillis"), text("timeZone"), text("msg"), integer("ttlMillis"), integer("maxRetry"),
                   integer("priority"), text("tag"), text("key"), integer("startTime"), optional("endTime"),
                   optional("limit"), integer("jitterMillis"), Misfire(text("misfire")),
                   integer("misfireGraceMillis"), integer("maxCatchUp"))

    @property
    def size_bytes(self) -> int:
        """What it holds, as --max-schedule-bytes counts it: its texts in
        UTF-8 bytes, as --max-msg-bytes counts a msg (by characters, 8 MiB
        of 4-byte ones held 33 MB), and 200 for the rest."""
        return sum(len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
                   for text in (self.msg, self.topic, self.schedule_id, self.tag, self.key)) + 200


def _schedule_id(params: Params) -> str:
    schedule_id = _name("scheduleId", params.get("scheduleId"), no_nul=True)
    if schedule_id is None:
        raise InvalidRequest("scheduleId", "is required")
    if len(schedule_id) > MAX_SCHEDULE_ID_CHARS:
        raise InvalidRequest("scheduleId", f"must be 1..{MAX_SCHEDULE_ID_CHARS} characters, got {len(schedule_id)}")
    return schedule_id


def _ranged(params: Params, parameter: str, low: int, high: int) -> int | None:
    value = _int(parameter, params.get(parameter))
    if value is not None and not low <= value <= high:
        raise InvalidRequest(parameter, f"must be in {low}..{high}, got {value}")
    return value


def parse_schedule_ref(params: Params) -> tuple[str, str]:
    return _required_name(params, "topic"), _schedule_id(params)


def parse_get_schedule(params: Params) -> tuple[str, str, int]:
    topic, schedule_id = parse_schedule_ref(params)
    following = _ranged(params, "next", 1, MAX_NEXT)
    return topic, schedule_id, DEFAULT_NEXT if following is None else following


def parse_list_schedules(params: Params) -> tuple[str, str | None, int]:
    topic = _required_name(params, "topic")
    cursor = _text("cursor", params.get("cursor"))
    if cursor is not None and (len(cursor) > MAX_SCHEDULE_ID_CHARS or "\0" in cursor):
        raise InvalidRequest("cursor", "is not a cursor listSchedules answered")
    limit = _ranged(params, "limit", 1, MAX_PAGE)
    return topic, cursor, DEFAULT_PAGE if limit is None else limit


def parse_put_schedule(params: Params, *, now_ms: int, defaults: Defaults,
                       max_msg_bytes: int) -> tuple[ScheduleSpec, int | None]:
    """putSchedule: the schedule, and the version it must replace (None:
    any; 0: none may exist). `startTime` defaults to `now_ms`."""
    topic, schedule_id = parse_schedule_ref(params)
    cron = _text("cron", params.get("cron"))
    every_ms = _int("everyMillis", params.get("everyMillis"))
    if (cron is None) == (every_ms is None):
        raise InvalidRequest("cron", "or everyMillis is required, not both")
    if cron is not None:
        if len(cron) > MAX_CRON_CHARS:
            raise InvalidRequest("cron", f"must be at most {MAX_CRON_CHARS} characters")
        Cron.parse(cron)
    if every_ms is not None and not MIN_EVERY_MS <= every_ms <= MAX_TRIGGER_MS:
        raise InvalidRequest("everyMillis", f"must be in {MIN_EVERY_MS}..{MAX_TRIGGER_MS}, got {every_ms}")
    time_zone = _text("timeZone", params.get("timeZone")) or "UTC"
    zone(time_zone)
    # the message fields, read as sendMsg reads them (no msgId, no delay: a run's are its own)
    for own in ("msgId", "delayMillis", "triggerTime"):
        if params.get(own) not in (None, ""):
            raise InvalidRequest(own, "is not a schedule's: each run has its own (docs/api.md)")
    fields = {name: params[name] for name in ("msg", "ttlMillis", "maxRetry", "priority", "tag", "key")
              if name in params}
    message = _message(fields, "", topic, now_ms, lambda: schedule_id, defaults, max_msg_bytes)
    start_ms = _ranged(params, "startTime", 0, MAX_TRIGGER_MS)
    start_ms = now_ms if start_ms is None else start_ms
    end_ms = _ranged(params, "endTime", 0, MAX_TRIGGER_MS)
    if end_ms is not None and end_ms <= start_ms:
        raise InvalidRequest("endTime", f"must be after startTime ({start_ms}), got {end_ms}")
    limit = _ranged(params, "limit", 1, MAX_LIMIT)
    grace = _ranged(params, "misfireGraceMillis", 0, MAX_TRIGGER_MS)
    grace_ms = DEFAULT_GRACE_MS if grace is None else grace
    jitter = _ranged(params, "jitterMillis", 0, MAX_TRIGGER_MS)
    jitter_ms = 0 if jitter is None else jitter
    if jitter_ms > grace_ms:
        raise InvalidRequest("jitterMillis", f"must be at most misfireGraceMillis ({grace_ms}): a run jittered "
                                             f"past its grace would count as missed, got {jitter_ms}")
    misfire_text = _text("misfire", params.get("misfire")) or Misfire.ONCE.value
    try:
        misfire = Misfire(misfire_text)
    except ValueError:
        raise InvalidRequest("misfire", f"must be skip, once or all, got {misfire_text[:40]!r}") from None
    catch_up = _ranged(params, "maxCatchUp", 1, MAX_CATCH_UP)
    version = _ranged(params, "version", 0, 2**62)
    spec = ScheduleSpec(topic, schedule_id, cron, every_ms, time_zone, message.msg, message.ttl_ms,
                        message.max_retry, message.priority, message.tag, message.key, start_ms, end_ms, limit,
                        jitter_ms, misfire, grace_ms, DEFAULT_MAX_CATCH_UP if catch_up is None else catch_up)
    return spec, version
