"""The store's public vocabulary: what a caller hands in and gets back.

A send is a batch of `NewMessage`s; each comes back as a `SendResult`
(STORED with the message at its new place, or DUPLICATE with the one
already stored under its (topic, msgId)). A status change is a
`StateChange` naming the message by its `Location`. A checkpoint answers
with a `CheckpointReport`. The limits a message's fields must keep
(`MAX_PRIORITY`, `MAX_RETRY_COUNT`, ...) and `validate_message`, which
refuses a message outside them with `InvalidRequest` naming the field,
live here too, beside what they bound.

Nothing here touches a file: these are values, hashed and compared.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from .checkpoint import HourRecord
from .entry import Location, Message, Status
from .errors import InvalidRequest

MAX_PRIORITY = 2**15 - 1
MIN_PRIORITY = -(2**15)
MAX_RETRY_COUNT = 2**16 - 1
# Longest fairKey, in UTF-8 bytes (SPEC: setTopicConfig's `fairness`).
MAX_FAIR_KEY_BYTES = 64
# A batch's characters, bounded so its record (UTF-8, up to 4 bytes each,
# plus framing) stays under storage.framing.MAX_BODY_BYTES.
MAX_RECORD_CHARS = 32 * 1024 * 1024


class NewMessage(NamedTuple):
    topic: str
    msg_id: str
    msg: str
    produce_ms: int
    trigger_ms: int
    ttl_ms: int
    max_retry: int
    priority: int = 0
    tag: str = ""
    key: str = ""  # serial key (SPEC `key`), in the body
    # W3C trace context the sender gave (docs/api.md, "Trace context"), in
    # the body; "" none. Checked by broker.core.trace_context before it is here.
    traceparent: str = ""
    tracestate: str = ""
    # The tenant a topic's fairness groups it by (docs/api.md, "Fairness
    # between tenants"), in the body; "" none; up to MAX_FAIR_KEY_BYTES.
    fair_key: str = ""


class SendOutcome(enum.Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # the id exists: `message` is the stored one, unchanged


class SendResult(NamedTuple):
    outcome: SendOutcome
    message: Message


STORED, DUPLICATE = SendOutcome.STORED, SendOutcome.DUPLICATE


class Intent(NamedTuple):
    """A large move taken and not yet carried out whole (Store.intend): the
    places it matched, and the new trigger time -- each message's shifted
    by `shift_ms`, or `trigger_ms` for all."""
    call_id: int
    topic: str
    shift_ms: int | None
    trigger_ms: int | None
    places: list[Location]


class StateChange(NamedTuple):
    location: Location
    status: Status
    retry: int
    released: bool = False  # deleted for good: lookups by id no longer find it
    deadline_ms: int = 0  # to CONSUMING: the ack deadline (see Store.ack_deadline)
    # The caller's knowledge of the message, to spare reading its entry: its
    # status before the change (0: unknown, read it) and its topic's hash.
    # Only for a message neither released nor changed earlier in the batch.
    prev_status: int = 0
    topic_hash: int = 0
    # Flag bits the change adds to the entry's (storage.delay_index: only
    # FLAG_PAUSED, an end's reason, is given here; 0 none).
    flags: int = 0
    # To CONSUMING: the hand-over's delivery (its `deliveryId`, docs/api.md
    # "Leases"), kept by an extension; 0 otherwise.
    delivery: int = 0


class CheckpointReport(NamedTuple):
    commit_offset: int
    segments_deleted: int
    hours_retired: tuple[int, ...]  # ascending


class PreparedCheckpoint(NamedTuple):
    offset: int
    kept: tuple[HourRecord, ...]
    retired: tuple[int, ...]
    now_ms: int
    topic_names: dict[int, str]
    consuming: tuple[tuple[int, int, int, int], ...]  # (hour, globalIndex, deadline, delivery)


def total_counts(hours: Iterable[tuple[int, list[int]]]) -> list[int]:
    """Per-status counts (index = status) summed over `topic_hours` rows."""
    total = [0] * 8
    for _, counts in hours:
        total = [a + b for a, b in zip(total, counts)]
    return total


def text_hash(text: str) -> int:
    """Non-zero 32-bit hash of a topic or tag (0 means "no tag")."""
    return (zlib.crc32(text.encode()) or 1) if text else 0


def validate_message(m: NewMessage, index: int) -> None:
    """Refuse (InvalidRequest naming `[index].field`) a message whose fields
    are out of range: the store checks every message of a send before it
    assigns anything."""
    where = f"[{index}]."
    if not m.topic:
        raise InvalidRequest(where + "topic", "must not be empty")
    if not m.msg_id:
        raise InvalidRequest(where + "msgId", "must not be empty")
    if m.trigger_ms < 0:
        raise InvalidRequest(where + "triggerTime", f"must be >= 0, got {m.trigger_ms}")
    if m.ttl_ms < 0:
        raise InvalidRequest(where + "ttlMillis", f"must be >= 0, got {m.ttl_ms}")
    if not 0 <= m.max_retry <= MAX_RETRY_COUNT:
        raise InvalidRequest(where + "maxRetry", f"must be in 0..{MAX_RETRY_COUNT}, got {m.max_retry}")
    if not MIN_PRIORITY <= m.priority <= MAX_PRIORITY:
        raise InvalidRequest(where + "priority", f"must be in {MIN_PRIORITY}..{MAX_PRIORITY}, got {m.priority}")
    if m.fair_key and len(m.fair_key.encode("utf-8", "surrogatepass")) > MAX_FAIR_KEY_BYTES:
        raise InvalidRequest(where + "fairKey", f"must be at most {MAX_FAIR_KEY_BYTES} UTF-8 bytes")
