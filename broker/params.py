"""Request parameters of the HTTP API: raw mapping in, typed request out.

Each `parse_*` function takes one request's parameters -- a `Mapping[str,
str]` from a form body or query string, or a `Mapping[str, object]` decoded
from a JSON body -- and returns a validated, typed request, or raises
`InvalidRequest(parameter, reason)` naming the first bad parameter. They are
pure: no aiohttp, no I/O, no clock (`now_ms` and `make_id` are arguments), so
the HTTP layer only maps `InvalidRequest` to 400 and `MessageTooLarge` to 413.

    endpoint        function          returns
    sendMsg         parse_send        storage.store.NewMessage
    sendMsgBatch    parse_send_batch  tuple[NewMessage, ...]
    deleteMsg       parse_delete      DeleteRequest
    pullMsg         parse_pull        PullRequest
    longPollingMsg  parse_long_poll   LongPollRequest
    ackMsg          parse_ack         AckRequest
    getMsg          parse_get         GetRequest
    getTopicInfo    parse_topic       TopicRequest

Rules, in the order a client meets them:

- Absent, JSON null, and the empty string all mean "not given". Unknown
  keys are ignored (camellia ignores them too).
- Numbers are decimal integers: form text matching `[+-]?[0-9]{1,19}`, or
  JSON ints; a JSON float is taken only when integral (`5.0`), never bools.
  A JSON string is parsed like form text.
- `ttlMillis`, `ackTimeoutMillis`, `batch`, `longPollingTimeoutMillis` not
  given or <= 0, and `maxRetry` not given or < 0, take the server's
  `Defaults` (camellia documents "<= 0" for ttlMillis and "< 0" for the
  others; a zero ack timeout, batch or poll is meaningless, so 0 defaults
  too, while maxRetry=0 is a real choice: one delivery). Above the
  server's maximum they are clamped to it, never refused: camellia has no
  maxima, and its SDK re-polls at once after an error.
- `delayMillis` not given is 0; <= 0 means due now (camellia's SDK sends
  negative delays for trigger times already past): the trigger time is
  `now`, as camellia's server sets it, so the ttl runs from now. When the
  extension `triggerTime` (absolute ms since the epoch) is given it wins
  and `delayMillis` is ignored, though still validated; a `triggerTime` in
  the past is kept (floored at 0) and due now. Beyond `MAX_TRIGGER_MS`
  (year 9999) is refused, naming whichever parameter produced it.
- `msg` is required and not empty (camellia); more than `max_msg_bytes`
  UTF-8 bytes raises `MessageTooLarge`; exactly at the limit is accepted.
- `strictIdempotence` (extension, a boolean on sendMsg, on sendMsgBatch's
  body or on an item): a resend of an id whose message has ended answers
  the stored message instead of storing the new one (see
  `NewSend.strict`).
- `topic`, `msgId` and `tag` are 1..1024 UTF-8 bytes; `topic` and `msgId`
  may not hold NUL (storage joins them with it), `tag` may not hold a comma
  (`tags` filters are comma lists). A missing `msgId` on sendMsg is made by
  `make_id()`.
- Booleans are true/false/1/0, any case (JSON true/false/0/1 as well).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from storage.entry import Status
from storage.errors import ConfigError, InvalidRequest
from storage.store import MAX_PRIORITY, MAX_RETRY_COUNT, MIN_PRIORITY, NewMessage

Params = Mapping[str, object]

# 9999-12-31T23:59:59.999Z: the last trigger time (and expire time) accepted.
MAX_TRIGGER_MS = 253_402_300_799_999
# Longest topic, msgId or tag, in UTF-8 bytes (camellia has no limit).
MAX_NAME_BYTES = 1024
# Most messages one pullMsg / longPollingMsg may ask for.
MAX_PULL_BATCH = 1000
# Most messages in one sendMsgBatch.
MAX_SEND_BATCH = 1000
# ids in one ackMsg with msgIds.
MAX_ACK_BATCH = 1000
# Most tags in one pull filter.
MAX_TAGS = 64
# listDeadMsg: messages a page holds at most.
MAX_DEAD_PAGE = 1000
# redriveMsg all=true: messages one call re-drives at most (it answers
# whether more are left; call again).
MAX_REDRIVE_ALL = 100_000
# Longest server-side long poll; a client asking for more gets this (its
# own HTTP timeout must exceed what it asked for, so it exceeds this too).
MAX_LONG_POLLING_TIMEOUT_MS = 5 * 60 * 1000
# Longest ttl a server may be configured to allow: up to the last trigger time.
MAX_DURATION_MS = MAX_TRIGGER_MS

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")  # ASCII only: int() would take "١" and "1_0"


class MessageTooLarge(InvalidRequest):
    """Raised while parsing a send when `msg` is longer than the server's
    --max-msg-bytes in UTF-8 bytes (the HTTP layer answers 413, not 400)."""


@dataclass(frozen=True)
class Defaults:
    """What a request gets for a parameter it leaves out (or sends as <= 0).
    Values are camellia-delay-queue's (CamelliaDelayQueueConstants) except
    `batch`, for which camellia's server states none."""

    # ttlMillis: how long a due message may stay unconsumed before it ends
    # (expireTime = triggerTime + ttl). camellia: 1 hour.
    ttl_ms: int = 60 * 60 * 1000
    # maxRetry: redeliveries after the first; at most max_retry + 1
    # deliveries. camellia: 10.
    max_retry: int = 10
    # ackTimeoutMillis: a pulled message not acked within this is delivered
    # again. camellia: 30 s.
    ack_timeout_ms: int = 30 * 1000
    # batch: messages per pull. 1, as camellia's SDK pulls by default; a
    # client wanting more says so.
    batch: int = 1
    # longPollingTimeoutMillis: how long a long poll waits for a message
    # before answering an empty list. camellia: 10 s.
    long_polling_timeout_ms: int = 10 * 1000
    # The largest ackTimeoutMillis a request gets (larger ones are clamped):
    # a pulled message is hidden from every consumer until its deadline,
    # and its ttl does not run meanwhile. --max-ack-timeout-ms.
    max_ack_timeout_ms: int = 60 * 60 * 1000
    # The largest ttlMillis a message gets (larger ones are clamped): how
    # long an ended-unconsumed message can hold a ready slot. --max-ttl-ms.
    max_ttl_ms: int = 30 * 24 * 60 * 60 * 1000

    def __post_init__(self) -> None:
        if not 1 <= self.ttl_ms <= MAX_DURATION_MS:
            raise ConfigError(f"default ttl_ms must be in 1..{MAX_DURATION_MS}, got {self.ttl_ms}")
        if not 0 <= self.max_retry <= MAX_RETRY_COUNT:
            raise ConfigError(f"default max_retry must be in 0..{MAX_RETRY_COUNT}, got {self.max_retry}")
        if not 1 <= self.ack_timeout_ms <= MAX_DURATION_MS:
            raise ConfigError(f"default ack_timeout_ms must be in 1..{MAX_DURATION_MS}, got {self.ack_timeout_ms}")
        if not 1 <= self.batch <= MAX_PULL_BATCH:
            raise ConfigError(f"default batch must be in 1..{MAX_PULL_BATCH}, got {self.batch}")
        if not 1 <= self.long_polling_timeout_ms <= MAX_LONG_POLLING_TIMEOUT_MS:
            raise ConfigError(f"default long_polling_timeout_ms must be in 1..{MAX_LONG_POLLING_TIMEOUT_MS}, "
                             f"got {self.long_polling_timeout_ms}")
        if not self.ack_timeout_ms <= self.max_ack_timeout_ms <= MAX_DURATION_MS:
            raise ConfigError(f"--max-ack-timeout-ms must be in {self.ack_timeout_ms}..{MAX_DURATION_MS} "
                             f"(at least the default ack timeout), got {self.max_ack_timeout_ms}")
        if not self.ttl_ms <= self.max_ttl_ms <= MAX_DURATION_MS:
            raise ConfigError(f"--max-ttl-ms must be in {self.ttl_ms}..{MAX_DURATION_MS} (at least the default "
                             f"ttl), got {self.max_ttl_ms}")


class DeleteRequest(NamedTuple):
    topic: str
    msg_id: str
    release: bool  # forget the message at once: getMsg answers 404 after


class PullRequest(NamedTuple):
    topic: str
    ack_timeout_ms: int
    batch: int
    tags: tuple[str, ...]  # only messages with one of these tags; () = any


class LongPollRequest(NamedTuple):
    topic: str
    ack_timeout_ms: int
    batch: int
    tags: tuple[str, ...]
    long_polling_timeout_ms: int


class AckRequest(NamedTuple):
    topic: str
    msg_id: str
    ack: bool  # False is a nack: deliverable again now


class AckManyRequest(NamedTuple):
    topic: str
    msg_ids: tuple[str, ...]
    ack: bool


class GetRequest(NamedTuple):
    topic: str
    msg_id: str


class RescheduleRequest(NamedTuple):
    topic: str
    msg_id: str
    trigger_ms: int  # absolute; <= now: due now


class ListDeadRequest(NamedTuple):
    topic: str
    statuses: frozenset[Status]  # of EXPIRED and ENDED
    cursor: str | None  # where the previous page stopped (opaque to clients)
    limit: int


class RedriveRequest(NamedTuple):
    topic: str
    msg_id: str | None  # one message, or None: all of the topic's (up to `limit`)
    limit: int


class TopicRequest(NamedTuple):
    topic: str


def decode_utf8(raw: bytes, parameter: str) -> str:
    """Strict UTF-8 decoding for the HTTP layer; bad bytes are a 400 naming
    `parameter` and the byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(parameter, f"is not valid UTF-8 (byte {e.start})") from None


class NewSend(NamedTuple):
    """A message to store, and how a resend of an ended id is treated:
    `strict` False (camellia) stores the new message in the old one's
    place; True answers the stored one unchanged while it is retained."""
    message: NewMessage
    strict: bool


def as_sends(items: Sequence[NewSend | NewMessage]) -> list[NewSend]:
    """A bare NewMessage (from Python callers) is a non-strict send."""
    return [item if isinstance(item, NewSend) else NewSend(item, False) for item in items]


def parse_send(params: Params, *, now_ms: int, make_id: Callable[[], str], defaults: Defaults,
               max_msg_bytes: int) -> NewSend:
    """sendMsg: produce time is `now_ms`; see the module docstring for the rules."""
    topic = params.get("topic")
    if type(topic) is str and _plain_name(topic) and params.get("strictIdempotence") in (None, ""):
        message = _fast_message(params, topic, now_ms, make_id, defaults, max_msg_bytes)
        if message is not None:
            return NewSend(message, False)
    return NewSend(_message(params, "", _required_name(params, "topic"), now_ms, make_id, defaults, max_msg_bytes),
                   _bool(params, "strictIdempotence", default=False))


def parse_send_batch(body: Params, *, now_ms: int, make_id: Callable[[], str], defaults: Defaults,
                     max_msg_bytes: int) -> tuple[NewSend, ...]:
    """sendMsgBatch, a JSON `{"topic": .., "msgs": [{sendMsg keys}, ..]}`,
    validated whole: the first bad item raises naming its index, e.g.
    `msgs[3].delayMillis`. An item may repeat `topic` only with the same value."""
    topic = _required_name(body, "topic")
    strict = _bool(body, "strictIdempotence", default=False)
    items = body.get("msgs")
    if not isinstance(items, list):
        raise InvalidRequest("msgs", "is required: a JSON list of messages")
    if not 1 <= len(items) <= MAX_SEND_BATCH:
        raise InvalidRequest("msgs", f"must hold 1..{MAX_SEND_BATCH} messages, got {len(items)}")
    out = []
    fast = _fast_message
    for i, item in enumerate(items):
        if type(item) is dict and item.get("strictIdempotence") is None:
            own = item.get("topic")
            if own is None or own == "" or own == topic:
                message = fast(item, topic, now_ms, make_id, defaults, max_msg_bytes)
                if message is not None:
                    out.append(tuple.__new__(NewSend, (message, strict)))
                    continue
        where = f"msgs[{i}]."
        if not isinstance(item, Mapping):
            raise InvalidRequest(f"msgs[{i}]", "must be a JSON object")
        own = _text(where + "topic", item.get("topic"))
        if own and own != topic:
            raise InvalidRequest(where + "topic", "differs from the batch's topic")
        message = _message(item, where, topic, now_ms, make_id, defaults, max_msg_bytes)
        out.append(NewSend(message, _bool(item, "strictIdempotence", default=strict, where=where)))
    return tuple(out)


def parse_delete(params: Params) -> DeleteRequest:
    return DeleteRequest(_required_name(params, "topic"), _required_name(params, "msgId"),
                         _bool(params, "release", default=False))


def parse_pull(params: Params, defaults: Defaults) -> PullRequest:
    topic = _required_name(params, "topic")
    ack_timeout_ms = _defaulted(params, "ackTimeoutMillis", defaults.ack_timeout_ms, defaults.max_ack_timeout_ms)
    batch = _defaulted(params, "batch", defaults.batch, MAX_PULL_BATCH)
    return PullRequest(topic, ack_timeout_ms, batch, _tags(params, "tags"))


def parse_long_poll(params: Params, defaults: Defaults) -> LongPollRequest:
    pull = parse_pull(params, defaults)
    timeout_ms = _defaulted(params, "longPollingTimeoutMillis", defaults.long_polling_timeout_ms,
                            MAX_LONG_POLLING_TIMEOUT_MS)
    return LongPollRequest(*pull, timeout_ms)


def parse_ack(params: Params) -> AckRequest | AckManyRequest:
    """ackMsg: `msgId`, or `msgIds` (ext) -- a comma list in a form, or a JSON
    list in a JSON body (for ids holding a comma) -- of 1..MAX_ACK_BATCH."""
    topic = _required_name(params, "topic")
    ack = _bool(params, "ack", default=True)
    many = params.get("msgIds")
    if many is None or many == "":
        return AckRequest(topic, _required_name(params, "msgId"), ack)
    if params.get("msgId") not in (None, ""):
        raise InvalidRequest("msgIds", "and msgId exclude each other")
    if isinstance(many, str):
        many = many.split(",")
    if not isinstance(many, list):
        raise InvalidRequest("msgIds", f"must be a comma list or a JSON list of ids, got {type(many).__name__}")
    if not 1 <= len(many) <= MAX_ACK_BATCH:
        raise InvalidRequest("msgIds", f"must hold 1..{MAX_ACK_BATCH} ids, got {len(many)}")
    ids = []
    for i, value in enumerate(many):
        msg_id = _name(f"msgIds[{i}]", value, no_nul=True)
        if msg_id is None:
            raise InvalidRequest(f"msgIds[{i}]", "is empty")
        ids.append(msg_id)
    return AckManyRequest(topic, tuple(ids), ack)


def parse_get(params: Params) -> GetRequest:
    return GetRequest(_required_name(params, "topic"), _required_name(params, "msgId"))


def parse_reschedule(params: Params, now_ms: int) -> RescheduleRequest:
    """rescheduleMsg: `triggerTime` (absolute, wins) or `delayMillis` from
    now, one of them required; <= 0 / in the past: due now."""
    topic, msg_id = _required_name(params, "topic"), _required_name(params, "msgId")
    delay_ms = _int("delayMillis", params.get("delayMillis"))
    trigger_ms = _int("triggerTime", params.get("triggerTime"))
    if trigger_ms is None and delay_ms is None:
        raise InvalidRequest("delayMillis", "or triggerTime is required")
    if trigger_ms is None:
        trigger_ms = now_ms + max(0, delay_ms)
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest("delayMillis", f"puts the trigger time past {MAX_TRIGGER_MS} (year 9999)")
    elif trigger_ms > MAX_TRIGGER_MS:
        raise InvalidRequest("triggerTime", f"must be at most {MAX_TRIGGER_MS} (ms epoch), got {trigger_ms}")
    return RescheduleRequest(topic, msg_id, max(0, trigger_ms))


def parse_list_dead(params: Params) -> ListDeadRequest:
    """listDeadMsg: `status` 5, 6 or "5,6" (default both), `cursor` from the
    previous page, `limit` 1..MAX_DEAD_PAGE (default 100)."""
    topic = _required_name(params, "topic")
    raw = params.get("status")
    statuses = {Status.EXPIRED, Status.ENDED}
    if raw not in (None, ""):
        parts = raw.split(",") if isinstance(raw, str) else [raw]
        statuses = set()
        for part in parts:
            value = _int("status", part)
            if value not in (Status.EXPIRED, Status.ENDED):
                raise InvalidRequest("status", f"must be 5, 6 or 5,6 (dead: expired, ended), got {raw!r}")
            statuses.add(Status(value))
    cursor = _text("cursor", params.get("cursor"), allow_empty=True) or None
    return ListDeadRequest(topic, frozenset(statuses), cursor, _defaulted(params, "limit", 100, MAX_DEAD_PAGE))


def parse_redrive(params: Params) -> RedriveRequest:
    """redriveMsg: `msgId`, or `all=true` (up to `limit`, default and most
    MAX_REDRIVE_ALL, per call)."""
    topic = _required_name(params, "topic")
    msg_id = _name("msgId", params.get("msgId"), no_nul=True)
    every = _bool(params, "all", default=False)
    if (msg_id is None) == (not every):
        raise InvalidRequest("msgId", "or all=true is required, not both")
    return RedriveRequest(topic, msg_id, _defaulted(params, "limit", MAX_REDRIVE_ALL, MAX_REDRIVE_ALL))


def parse_topic(params: Params) -> TopicRequest:
    """getTopicInfo."""
    return TopicRequest(_required_name(params, "topic"))


# ---------------------------------------------------------------- internals
# Each helper takes the full parameter name it reports (`msgs[3].ttlMillis`)
# separately from the key it reads (`ttlMillis`).

def _message(params: Params, where: str, topic: str, now_ms: int, make_id: Callable[[], str],
             defaults: Defaults, max_msg_bytes: int) -> NewMessage:
    msg = _text(where + "msg", params.get("msg"))
    if msg is None:
        raise InvalidRequest(where + "msg", "is required and may not be empty")
    size = _utf8_len(msg, where + "msg")
    if size > max_msg_bytes:
        raise MessageTooLarge(where + "msg", f"is {size} UTF-8 bytes, more than the limit of {max_msg_bytes}")
    given_id = _name(where + "msgId", params.get("msgId"), no_nul=True)
    msg_id = given_id if given_id is not None else make_id()

    delay_ms = _int(where + "delayMillis", params.get("delayMillis"))
    trigger_ms = _int(where + "triggerTime", params.get("triggerTime"))
    if trigger_ms is not None:
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest(where + "triggerTime", f"must be at most {MAX_TRIGGER_MS} (ms epoch), got {trigger_ms}")
        trigger_ms = max(0, trigger_ms)
    else:
        trigger_ms = now_ms + max(0, delay_ms or 0)  # <= 0: now, as camellia's server
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest(where + "delayMillis", f"puts the trigger time past {MAX_TRIGGER_MS} (year 9999)")

    ttl_ms = _defaulted(params, where + "ttlMillis", defaults.ttl_ms, defaults.max_ttl_ms)
    max_retry = _int(where + "maxRetry", params.get("maxRetry"))
    if max_retry is None or max_retry < 0:
        max_retry = defaults.max_retry
    max_retry = min(max_retry, MAX_RETRY_COUNT - 1)  # retry counts deliveries: up to max_retry + 1
    priority = _int(where + "priority", params.get("priority"))
    if priority is None:
        priority = 0
    elif not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidRequest(where + "priority", f"must be in {MIN_PRIORITY}..{MAX_PRIORITY}, got {priority}")
    tag = _name(where + "tag", params.get("tag"), no_comma=True) or ""
    key = _name(where + "key", params.get("key"), no_nul=True) or ""
    return NewMessage(topic, msg_id, msg, now_ms, trigger_ms, ttl_ms, max_retry, priority, tag, key)


# The fast path: a message whose every parameter is of the plain kind most
# clients send (a non-empty ASCII-checkable string, a JSON int or decimal
# digits, nothing out of range) is built here with no per-parameter helper
# calls; anything else returns None and takes `_message`, which accepts it or
# names what is wrong. Both give the same NewMessage for what the fast path
# takes (tests/property/test_params_properties.py).

_MISSING = object()


def _plain_int(value: object) -> object:
    """An int, _MISSING (not given), or None (not plain: the full rules decide)."""
    kind = type(value)
    if kind is int:
        return value
    if value is None or value == "":
        return _MISSING
    if kind is str and len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return None


def _plain_name(text: str) -> bool:
    """A topic, msgId or key of 1..MAX_NAME_BYTES UTF-8 bytes without NUL."""
    if text.isascii():
        return 0 < len(text) <= MAX_NAME_BYTES and "\0" not in text
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return size <= MAX_NAME_BYTES and "\0" not in text


def _fast_message(params: Mapping, topic: str, now_ms: int, make_id: Callable[[], str], defaults: Defaults,
                  max_msg_bytes: int) -> NewMessage | None:
    get = params.get
    msg = get("msg")
    if type(msg) is not str or not msg:
        return None
    if len(msg) * 4 > max_msg_bytes:  # may be too large: count its bytes
        try:
            if len(msg.encode("utf-8")) > max_msg_bytes:
                return None
        except UnicodeEncodeError:
            return None
    elif not msg.isascii():
        try:
            msg.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            return None
    msg_id = get("msgId")
    if msg_id == "":
        msg_id = None
    elif msg_id is not None and (type(msg_id) is not str or not _plain_name(msg_id)):
        return None
    trigger_ms = _plain_int(get("triggerTime"))
    delay_ms = _plain_int(get("delayMillis"))
    if trigger_ms is None or delay_ms is None:
        return None
    if trigger_ms is _MISSING:
        trigger_ms = now_ms + (delay_ms if delay_ms is not _MISSING and delay_ms > 0 else 0)
        if trigger_ms > MAX_TRIGGER_MS:
            return None
    elif not 0 <= trigger_ms <= MAX_TRIGGER_MS:
        return None
    ttl_ms = _plain_int(get("ttlMillis"))
    if ttl_ms is None:
        return None
    ttl_ms = defaults.ttl_ms if ttl_ms is _MISSING or ttl_ms <= 0 else min(ttl_ms, defaults.max_ttl_ms)
    max_retry = _plain_int(get("maxRetry"))
    if max_retry is None:
        return None
    max_retry = min(defaults.max_retry if max_retry is _MISSING or max_retry < 0 else max_retry, MAX_RETRY_COUNT - 1)
    priority = _plain_int(get("priority"))
    if priority is None:
        return None
    if priority is _MISSING:
        priority = 0
    elif not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return None
    tag = get("tag")
    if tag is None or tag == "":
        tag = ""
    elif type(tag) is not str or "," in tag or not _plain_name(tag):
        return None
    key = get("key")
    if key is None or key == "":
        key = ""
    elif type(key) is not str or not _plain_name(key):
        return None
    return tuple.__new__(NewMessage, (topic, make_id() if msg_id is None else msg_id, msg, now_ms, trigger_ms, ttl_ms,
                                      max_retry, priority, tag, key))  # (NewMessage's own __new__ is Python code)


def _key(parameter: str) -> str:
    return parameter.rsplit(".", 1)[-1]


def _required_name(params: Params, parameter: str) -> str:
    """A top-level topic or msgId."""
    value = _name(parameter, params.get(parameter), no_nul=True)
    if value is None:
        raise InvalidRequest(parameter, "is required")
    return value


def _text(parameter: str, value: object, allow_empty: bool = False) -> str | None:
    """The string value, or None when not given ("" counts as not given
    unless `allow_empty`)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(parameter, f"must be a string, got {type(value).__name__}")
    if value == "" and not allow_empty:
        return None
    return value


def _name(parameter: str, value: object, no_nul: bool = False, no_comma: bool = False) -> str | None:
    text = _text(parameter, value)
    if text is None:
        return None
    size = _utf8_len(text, parameter)
    if size > MAX_NAME_BYTES:
        raise InvalidRequest(parameter, f"must be at most {MAX_NAME_BYTES} UTF-8 bytes, got {size}")
    if no_nul and "\0" in text:
        raise InvalidRequest(parameter, "must not contain a NUL character")
    if no_comma and "," in text:
        raise InvalidRequest(parameter, "must not contain a comma (tag filters are comma lists)")
    return text


def _utf8_len(text: str, parameter: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, e.g. JSON "\ud800"
        raise InvalidRequest(parameter, "is not valid UTF-8 (lone surrogate)") from None


def _int(parameter: str, value: object) -> int | None:
    """A whole number, or None when not given."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(parameter, "must be a whole number, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise InvalidRequest(parameter, f"must be a whole number, got {value!r}")
    if isinstance(value, str):
        if _INTEGER.fullmatch(value):
            return int(value)
        raise InvalidRequest(parameter, f"must be a whole number, got {value[:40]!r}")
    raise InvalidRequest(parameter, f"must be a whole number, got {type(value).__name__}")


def _defaulted(params: Params, parameter: str, default: int, maximum: int) -> int:
    """A positive duration or count: <= 0 or not given means `default`,
    above `maximum` means `maximum`."""
    value = _int(parameter, params.get(_key(parameter)))
    if value is None or value <= 0:
        return default
    return min(value, maximum)


def _bool(params: Params, parameter: str, default: bool, where: str = "") -> bool:
    value = params.get(parameter)
    parameter = where + parameter
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
    raise InvalidRequest(parameter, f"must be true, false, 1 or 0, got {str(value)[:40]!r}")


def _tags(params: Params, parameter: str) -> tuple[str, ...]:
    """A comma list (or a JSON list of strings); empty items are dropped."""
    value = params.get(parameter)
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidRequest(parameter, "must be a comma-separated string or a list of strings")
    tags = []
    for item in items:
        tag = _name(parameter, item, no_comma=True)
        if tag is not None:
            tags.append(tag)
    if len(tags) > MAX_TAGS:
        raise InvalidRequest(parameter, f"must hold at most {MAX_TAGS} tags, got {len(tags)}")
    return tuple(dict.fromkeys(tags))
