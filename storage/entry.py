"""What the rest of hourglass sees of one index entry and one message.

`IndexEntry` is the decoded form of a delay-index entry (the byte layout is
in `storage.delay_index`); `Message` adds the body read from the delay log.
The timing wheel works on `IndexEntry` alone, so it never reads bodies.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

MS_PER_SECOND = 1000
SECONDS_PER_HOUR = 3600
MS_PER_HOUR = MS_PER_SECOND * SECONDS_PER_HOUR


class Status(enum.IntEnum):
    """A message's state, numbered as in docs/api.md (the message's statuses)."""

    WAITING = 1  # stored, trigger time not reached
    READY = 2  # due, deliverable
    CONSUMING = 3  # pulled, not acked yet
    ACKED = 4
    EXPIRED = 5  # ttl passed, never delivered
    ENDED = 6  # retries or ttl exhausted after delivery, never acked
    DELETED = 7


# Status by its number: what decoding does for every entry and state it
# reads (a dict lookup; `Status(n)` runs the enum machinery, ~20 times as
# long). A number that is no status is a KeyError: decoders check the
# range first (storage.delay_index).
STATUS_BY_VALUE: dict[int, Status] = {int(s): s for s in Status}


# Message.end_reason of a message a resume's `expire` ended (docs/api.md, "Flow").
END_PAUSED = "paused"


# A record's fields read by index, as objects: a NamedTuple's `int` field
# read by name (or a slice of one) the compiled build turns into a C
# integer and boxes anew where it goes into the next tuple, list or dict,
# a heap allocation for each value past 256. Where a hot path only passes
# such fields on, it reads them through this view, and the same objects
# go on (docs/dependencies.md, "Ints passed on, read as objects").
Fields = tuple[object, ...]


class Location(NamedTuple):
    """Where a message's index entry lives: hour number and globalIndex."""

    hour: int  # UTC hours since the epoch
    global_index: int


class IndexEntry(NamedTuple):
    hour: int
    second: int  # 0..3599 within the hour
    local_index: int  # ordinal within its second
    global_index: int  # ordinal within its hour
    pre_global_index: int  # previous entry of the same second, or -1
    trigger_ms: int
    priority: int
    topic_hash: int
    tag_hash: int  # 0: no tag
    status: Status
    retry: int

    @property
    def location(self) -> Location:
        return Location(self.hour, self.global_index)


class Message(NamedTuple):
    topic: str
    msg_id: str
    msg: str
    produce_ms: int
    trigger_ms: int
    ttl_ms: int
    max_retry: int
    priority: int
    tag: str
    status: Status
    retry: int
    location: Location
    key: str = ""  # serial key: one of a (topic, key) is consumed at a time; "" none
    traceparent: str = ""  # the sender's W3C trace context, kept with the message; "" none
    tracestate: str = ""
    redrive_count: int = 0  # times a redriveMsgs job put it back (storage.delay_log); 0 none
    fair_key: str = ""  # the tenant a topic's fairness groups it by (docs/api.md); "" none
    # Why an ended message ended, when its entry says (END_PAUSED: a
    # resume's `expire`, flag FLAG_PAUSED of storage.delay_index); "" else
    end_reason: str = ""
    # The hand-over a pull's answer made of it (its `deliveryId`: docs/api.md,
    # "Leases"); 0 in every other answer
    delivery: int = 0

    @property
    def expire_ms(self) -> int:
        return self.trigger_ms + self.ttl_ms

    def with_state(self, status: Status, retry: int) -> Message:
        """The same message with another status and retry: `_replace`'s
        result, built without its Python-level keyword handling (the
        release and pull paths make one per message)."""
        return tuple.__new__(Message, (*self[:9], status, retry, *self[11:]))

    def handed_over(self, retry: int, delivery: int) -> Message:
        """The same message CONSUMING with `retry`, handed over in `delivery`
        (as `with_state`, for a pull's answer)."""
        return tuple.__new__(Message, (*self[:9], Status.CONSUMING, retry, *self[11:18], delivery))


def hour_and_second(ms: int) -> tuple[int, int]:
    """The UTC hour number and the second within it of an epoch millisecond."""
    hour, rest_ms = divmod(ms, MS_PER_HOUR)
    return hour, rest_ms // MS_PER_SECOND
