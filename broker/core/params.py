"""Request parameters of the HTTP API: a request's bytes in, a typed
request out.

A request's bytes become its parameters here (`query_params` for a GET,
`body_params` for a POST's form or JSON body), within what `broker.core.bodies`
lets a body cost (over a bound: BodyTooLarge, 413, before decoding).
Each `parse_*` function then takes one request's parameters -- a
`Mapping[str, str]` from a form body or query string, or a `Mapping[str,
object]` decoded from a JSON body -- and returns a validated, typed
request, or raises `InvalidRequest(parameter, reason)` naming the first bad
parameter. sendMsgBatch goes from bytes to sends in one call,
`parse_send_batch_body`. All of it is pure: no aiohttp, no I/O, no clock
(`now_ms` and `make_id` are arguments), so the HTTP layer only maps
`InvalidRequest` to 400 and `MessageTooLarge` to 413.

    endpoint        function               returns
    sendMsg         parse_send             NewSend
    sendMsgBatch    parse_send_batch_body  tuple[NewSend, ...]
                    (parse_send_batch      the same, from a decoded body)
    deleteMsg       parse_delete           DeleteRequest
    pullMsg         parse_pull             PullRequest
    longPollingMsg  parse_long_poll        LongPollRequest
    ackMsg          parse_ack              AckRequest | AckManyRequest, or
                                           FencedRequest with deliveryId(s)
    extendMsg       parse_extend           FencedRequest
    getMsg          parse_get              GetRequest
    rescheduleMsg   parse_reschedule       RescheduleRequest
    listDeadMsg     parse_list_dead        WalkRequest
    exportMsg       (bulk_params) parse_export_msg  WalkRequest
    redriveMsg      parse_redrive          RedriveRequest
    getTopicInfo    parse_topic            TopicRequest

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
- `topic`, `msgId`, `key` and `tag` are 1..1024 UTF-8 bytes; `topic`,
  `msgId` and `key` may not hold NUL (storage joins them with it), `tag`
  may not hold a comma (`tags` filters are comma lists). A missing `msgId`
  on sendMsg is made by `make_id()`.
- `fairKey` (extension: the tenant a topic's fairness groups the message
  by) is 1..MAX_FAIR_KEY_BYTES (64) UTF-8 bytes, any text but NUL, as
  `key`'s, only shorter: a group's name is kept in RAM per group.
- A `msgId` of a run's form, `<scheduleId>@<digits>`, naming a schedule
  of the topic is refused (400 naming `msgId`, in a batch the whole batch):
  a schedule's runs are its own (docs/api.md, "Recurring schedules").
  Which ids those are (`run_schedule_ids`) is found here; whether such a
  schedule exists, the caller asks (broker.http.api), then `run_id_taken`.
- Booleans are true/false/1/0, any case (JSON true/false/0/1 as well).
- `traceparent` and `tracestate` (extension, on sendMsg or an item): W3C
  trace context, checked by `broker.core.trace_context`; a tracestate needs a
  traceparent. sendMsg's HTTP headers of those names apply when its
  parameters give neither (`with_trace_headers`).

A message's rules are written once, in `_message` and the helpers it
calls: sendMsg and every sendMsgBatch item go through them, and they take
the common case (a JSON int, decimal digits, ASCII text) first rather than
beside them in a second, faster copy.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import orjson

from storage.entry import Status
from storage.errors import ConfigError, InvalidRequest
from storage.store import MAX_FAIR_KEY_BYTES, MAX_PRIORITY, MAX_RETRY_COUNT, MIN_PRIORITY, NewMessage
from storage.types import validate_message

from .bodies import JSON_MARKS_PER_BODY, MAX_SEND_BATCH, BodyLimits, check_json_marks, check_size
from .leases import parse_delivery_id
from .recurrence import parse_run_msg_id
from .trace_context import trace_fields

Params = Mapping[str, object]

# 9999-12-31T23:59:59.999Z: the last trigger time (and expire time) accepted.
MAX_TRIGGER_MS = 253_402_300_799_999
# Longest topic, msgId or tag, in UTF-8 bytes (camellia has no limit).
MAX_NAME_BYTES = 1024
# Most messages one pullMsg / longPollingMsg may ask for.
MAX_PULL_BATCH = 1000
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

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")  # ASCII only: int() would take "1_0" and other scripts' digits


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
    # The longest a message stays with one holder by extendMsg, from its
    # hand-over (docs/api.md, "Leases"): SQS's 12 h. --max-lease-ms.
    max_lease_ms: int = 12 * 60 * 60 * 1000

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
        if not 1 <= self.max_lease_ms <= MAX_DURATION_MS:
            raise ConfigError(f"--max-lease-ms must be in 1..{MAX_DURATION_MS}, got {self.max_lease_ms}")
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
    # A push subscription's timeoutMillis when a pusher polls (broker.push.pusher;
    # 0: a consumer's poll): a backend may hand the delivery back once it
    # has passed and the polling node is gone (the Redis backend does).
    push_timeout_ms: int = 0


class AckRequest(NamedTuple):
    topic: str
    msg_id: str
    ack: bool  # False is a nack: deliverable again now


class AckManyRequest(NamedTuple):
    topic: str
    msg_ids: tuple[str, ...]
    ack: bool


class Fenced(enum.Enum):
    """What a request fenced by deliveries does (docs/api.md, "Leases")."""

    ACK = "ack"
    NACK = "nack"
    EXTEND = "extend"


class FencedRequest(NamedTuple):
    """An ackMsg with `deliveryId` (or `deliveryIds`), or an extendMsg: each
    msgId's change only while `deliveries`' is its current hand-over."""

    topic: str
    msg_ids: tuple[str, ...]
    deliveries: tuple[int, ...]  # each msgId's, in order
    kind: Fenced
    many: bool  # given as msgIds: answered a result per id
    ack_timeout_ms: int = 0  # EXTEND: consuming until this long from now
    max_lease_ms: int = 0  # EXTEND: the longest from the hand-over (--max-lease-ms)


class GetRequest(NamedTuple):
    topic: str
    msg_id: str


class RescheduleRequest(NamedTuple):
    topic: str
    msg_id: str
    trigger_ms: int  # absolute; <= now: due now


class WalkRequest(NamedTuple):
    """A page of a walk through a topic in the order the backend holds it (listDeadMsg, exportMsg)."""
    topic: str
    statuses: frozenset[Status]  # listDeadMsg: of EXPIRED and ENDED
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
    place; True answers the stored one unchanged while it is retained.
    `skip_after_ms` (a schedule's run with misfire=skip: its nominal time
    plus misfireGraceMillis; None otherwise): a first release after it ends
    the message unseen (status 5). The Redis backend stores it with the
    message and its release script decides; the disk backend asks
    `Schedules.on_release` at the release instead (broker.schedules.keeper).
    `run`: a schedule's run (the Redis backend holds it back while its
    topic or serial key is paused; docs/redis.md, "Flow"). `made_id`: the
    request gave no msgId, the node made it (a node of shards takes such a
    message back if its batch answers 503: broker.shards.backend).
    `kept`: an import's (importMsgBatch) status and retry count, the
    message stored with them (1: pending, at its trigger time; 5, 6:
    dead); None: a send's, WAITING with retry 0."""
    message: NewMessage
    strict: bool
    skip_after_ms: int | None = None
    run: bool = False
    made_id: bool = False
    kept: tuple[int, int] | None = None


def as_sends(items: Sequence[NewSend | NewMessage]) -> list[NewSend]:
    """A bare NewMessage (from Python callers) is a non-strict send, its
    fields checked here (storage.types.validate_message) as parsing checks
    a request's: the store is told every send it gets is checked."""
    sends = []
    for i, item in enumerate(items):
        if not isinstance(item, NewSend):
            validate_message(item, i)
            if item.traceparent or item.tracestate:
                try:
                    trace_fields(item.traceparent, item.tracestate)
                except InvalidRequest as e:
                    raise _within(e, f"[{i}].") from None
            item = NewSend(item, False)
        sends.append(item)
    return sends


def parse_send(params: Params, *, now_ms: int, make_id: Callable[[], str], defaults: Defaults,
               max_msg_bytes: int) -> NewSend:
    """sendMsg: produce time is `now_ms`; see the module docstring for the rules."""
    message = _message(params, "", _required_name(params, "topic"), now_ms, make_id, defaults, max_msg_bytes)
    made = not params.get("msgId")  # (None or "": _message made it)
    if params.get("strictIdempotence") is None:
        return tuple.__new__(NewSend, (message, False, None, False, made, None))  # (every field: no default filled)
    return NewSend(message, _bool(params, "strictIdempotence", default=False), made_id=made)


def with_trace_headers(params: Params, headers: Mapping[str, str]) -> Params:
    """sendMsg's parameters, with the `traceparent` and `tracestate` of its
    HTTP headers when the parameters give neither (a parameter wins: the
    pair comes from one place). The API calls it only when a header of
    those names came, so a plain send pays nothing."""
    given = params.get("traceparent"), params.get("tracestate")
    if given[0] not in (None, "") or given[1] not in (None, ""):
        return params
    return {**params, "traceparent": headers.get("traceparent"), "tracestate": headers.get("tracestate")}


def parse_send_batch(body: Params, *, now_ms: int, make_id: Callable[[], str], defaults: Defaults,
                     max_msg_bytes: int) -> tuple[NewSend, ...]:
    """sendMsgBatch, a JSON `{"topic": .., "msgs": [{sendMsg keys}, ..]}`,
    validated whole: the first bad item raises naming its index, e.g.
    `msgs[3].delayMillis`. An item may repeat `topic` only with the same
    value, and its `strictIdempotence` overrides the body's."""
    topic = _required_name(body, "topic")
    strict = _bool(body, "strictIdempotence", default=False)
    items = body.get("msgs")
    if not isinstance(items, list):
        raise InvalidRequest("msgs", "is required: a JSON list of messages")
    if not 1 <= len(items) <= MAX_SEND_BATCH:
        raise InvalidRequest("msgs", f"must hold 1..{MAX_SEND_BATCH} messages, got {len(items)}")
    out = []
    new = tuple.__new__
    for i, item in enumerate(items):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise InvalidRequest(f"msgs[{i}]", "must be a JSON object")
        try:
            own = item.get("topic")
            if own is not None and own != topic and _text("topic", own) is not None:
                raise InvalidRequest("topic", "differs from the batch's topic")
            message = _message(item, "", topic, now_ms, make_id, defaults, max_msg_bytes)
            own_strict = item.get("strictIdempotence")
            out.append(new(NewSend, (message, strict if own_strict is None
                                     else _bool(item, "strictIdempotence", default=strict), None, False,
                                     not item.get("msgId"), None)))
        except InvalidRequest as e:
            raise _within(e, f"msgs[{i}].") from None
    return tuple(out)


def run_schedule_ids(sends: Sequence[NewSend]) -> list[tuple[int, str]]:
    """(index, scheduleId) of each send whose msgId has a run's form
    `<scheduleId>@<digits>` (broker.core.recurrence): the sends to check
    against the topic's schedules (`run_id_taken`)."""
    found = []
    for i, send in enumerate(sends):
        msg_id = send.message.msg_id
        if "@" in msg_id:
            run = parse_run_msg_id(msg_id)
            if run is not None:
                found.append((i, run[0]))
    return found


def run_id_taken(sends: Sequence[NewSend], found: list[tuple[int, str]], scheduled: set[str],
                 batch: bool) -> InvalidRequest | None:
    """The refusal of the first send of `found` whose scheduleId is in
    `scheduled` (the topic's schedules among them), naming `msgId`
    (`msgs[i].msgId` in a batch); None if none is."""
    for i, schedule_id in found:
        if schedule_id in scheduled:
            return InvalidRequest(f"msgs[{i}].msgId" if batch else "msgId",
                                  f"{sends[i].message.msg_id!r} has the form of a run of schedule {schedule_id!r} "
                                  f"of this topic (<scheduleId>@<digits>): a schedule's runs are its own; "
                                  f"choose another msgId")
    return None


def parse_delete(params: Params) -> DeleteRequest:
    return DeleteRequest(_required_name(params, "topic"), _required_name(params, "msgId"),
                         _bool(params, "release", default=False))


def parse_pull(params: Params, defaults: Defaults) -> PullRequest:
    topic = _required_name(params, "topic")
    ack_timeout_ms = _defaulted(params, "ackTimeoutMillis", defaults.ack_timeout_ms, defaults.max_ack_timeout_ms)
    batch = _defaulted(params, "batch", defaults.batch, MAX_PULL_BATCH)
    tags = () if params.get("tags") is None else _tags(params, "tags")
    return tuple.__new__(PullRequest, (topic, ack_timeout_ms, batch, tags))


def parse_long_poll(params: Params, defaults: Defaults) -> LongPollRequest:
    pull = parse_pull(params, defaults)
    timeout_ms = _defaulted(params, "longPollingTimeoutMillis", defaults.long_polling_timeout_ms,
                            MAX_LONG_POLLING_TIMEOUT_MS)
    return LongPollRequest(*pull, timeout_ms)


def parse_ack(params: Params) -> AckRequest | AckManyRequest | FencedRequest:
    """ackMsg: `msgId`, or `msgIds` (ext) -- a comma list in a form, or a JSON
    list in a JSON body (for ids holding a comma) -- of 1..MAX_ACK_BATCH.
    With `deliveryId` (`deliveryIds` with msgIds, in their order): fenced."""
    topic = _required_name(params, "topic")
    given = params.get("ack")  # (its usual values read here: `_bool`'s rules, no call)
    ack = True if given is None or given is True or given == "true" else _bool(params, "ack", default=True)
    many = params.get("msgIds")
    if many is None or many == "":
        msg_id = _required_name(params, "msgId")
        if params.get("deliveryId") in (None, "") and params.get("deliveryIds") in (None, ""):
            return tuple.__new__(AckRequest, (topic, msg_id, ack))
        return _fenced(params, topic, (msg_id,), Fenced.ACK if ack else Fenced.NACK)
    ids = _msg_ids(params)
    if params.get("deliveryIds") in (None, "") and params.get("deliveryId") in (None, ""):
        return AckManyRequest(topic, ids, ack)
    return _fenced(params, topic, ids, Fenced.ACK if ack else Fenced.NACK, many=True)


def parse_extend(params: Params, defaults: Defaults) -> FencedRequest:
    """extendMsg: `topic`, `msgId` and `deliveryId`, or `msgIds` and
    `deliveryIds` in the same order; `ackTimeoutMillis` from now (not
    given or <= 0: the default ack timeout; above --max-ack-timeout-ms:
    that)."""
    topic = _required_name(params, "topic")
    timeout_ms = _defaulted(params, "ackTimeoutMillis", defaults.ack_timeout_ms, defaults.max_ack_timeout_ms)
    many = params.get("msgIds") not in (None, "")
    ids = _msg_ids(params) if many else (_required_name(params, "msgId"),)
    return _fenced(params, topic, ids, Fenced.EXTEND, many, timeout_ms, defaults.max_lease_ms)


def _msg_ids(params: Params) -> tuple[str, ...]:
    """`msgIds`: a comma list or a JSON list of 1..MAX_ACK_BATCH ids."""
    many = params.get("msgIds")
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
    return tuple(ids)


def _fenced(params: Params, topic: str, ids: tuple[str, ...], kind: Fenced, many: bool = False,
            ack_timeout_ms: int = 0, max_lease_ms: int = 0) -> FencedRequest:
    """The deliveries of `ids`: `deliveryId` for one msgId, `deliveryIds` (a
    comma list or a JSON list, as msgIds) for msgIds, in their order."""
    if not many:
        if params.get("deliveryIds") not in (None, ""):
            raise InvalidRequest("deliveryIds", "goes with msgIds; with msgId, give deliveryId")
        one = params.get("deliveryId")
        if one is None or one == "":
            raise InvalidRequest("deliveryId", "is required")
        if not isinstance(one, str):
            raise InvalidRequest("deliveryId", f"must be a string of hex digits, got {type(one).__name__}")
        return FencedRequest(topic, ids, (parse_delivery_id(one),), kind, False, ack_timeout_ms, max_lease_ms)
    if params.get("deliveryId") not in (None, ""):
        raise InvalidRequest("deliveryId", "goes with msgId; with msgIds, give deliveryIds")
    given = params.get("deliveryIds")
    if given is None or given == "":
        raise InvalidRequest("deliveryIds", "is required, one a msgId in the same order")
    if isinstance(given, str):
        given = given.split(",")
    if not isinstance(given, list):
        raise InvalidRequest("deliveryIds", f"must be a comma list or a JSON list, got {type(given).__name__}")
    if len(given) != len(ids):
        raise InvalidRequest("deliveryIds", f"must hold one a msgId ({len(ids)}), got {len(given)}")
    # Each distinct deliveryId parsed once (a pull's messages share theirs);
    # the deliveries held as objects, so that the compiled build hands on
    # the one int, not a new one an id.
    parsed: dict[str, object] = {}
    deliveries: list[object] = []
    for i, value in enumerate(given):
        delivery = parsed.get(value) if isinstance(value, str) else None
        if delivery is None:
            if not isinstance(value, str):
                raise InvalidRequest(f"deliveryIds[{i}]", f"must be a string of hex digits, got {type(value).__name__}")
            delivery = parsed[value] = parse_delivery_id(value, f"deliveryIds[{i}]")
        deliveries.append(delivery)
    return FencedRequest(topic, ids, cast(tuple[int, ...], tuple(deliveries)), kind, True, ack_timeout_ms, max_lease_ms)


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
    return RescheduleRequest(topic, msg_id, _trigger_ms(now_ms, delay_ms, trigger_ms))


def parse_list_dead(params: Params) -> WalkRequest:
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
    return WalkRequest(topic, frozenset(statuses), cursor, _defaulted(params, "limit", 100, MAX_DEAD_PAGE))



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


# ---------------------------------------------------------------- bodies
# A request's bytes become its parameters here, within what broker.core.bodies
# lets them cost, before any `parse_*` above reads them.

def query_params(query: bytes, limits: BodyLimits) -> dict[str, str]:
    """A GET's parameters: its query string (still %-encoded)."""
    limits.check_form(query, "the query string")
    return parse_form(query)


def request_params(method: str, query: bytes, body: bytes, content_type: str, limits: BodyLimits,
                   max_msg_bytes: int) -> Params:
    """A request's parameters: a GET's query string, else its body."""
    if method == "GET":
        return query_params(query, limits)
    return body_params(body, content_type, limits, max_msg_bytes)


def body_params(body: bytes, content_type: str, limits: BodyLimits, max_msg_bytes: int) -> Params:
    """A POST's parameters, any call's but sendMsgBatch's: a JSON object
    when `content_type` is application/json, else a form."""
    check_size(body, limits.body_bytes(max_msg_bytes))
    if content_type == "application/json":
        check_json_marks(body, JSON_MARKS_PER_BODY, "the body")
        return parse_json(body)
    limits.check_form(body, "the form body")
    return parse_form(body)


def parse_send_batch_body(body: bytes, content_type: str, *, limits: BodyLimits, now_ms: int,
                          make_id: Callable[[], str], defaults: Defaults, max_msg_bytes: int) -> tuple[NewSend, ...]:
    """sendMsgBatch from its body: a JSON object, or a form whose `msgs`
    holds the JSON list (`topic` beside it); then `parse_send_batch`. More
    messages than --max-batch-msgs raise BodyTooLarge (413), not
    InvalidRequest: the client splits the batch."""
    check_size(body, limits.batch_body_bytes(max_msg_bytes))
    decoded: Params
    if content_type == "application/json":
        check_json_marks(body, limits.batch_json_marks, "the body")
        decoded = parse_json(body)
    else:
        decoded = _batch_form(body, limits)
    items = decoded.get("msgs")
    if isinstance(items, list):
        limits.check_batch_msgs(len(items))
    return parse_send_batch(decoded, now_ms=now_ms, make_id=make_id, defaults=defaults, max_msg_bytes=max_msg_bytes)


def parse_import_batch_body(body: bytes, *, limits: BodyLimits, now_ms: int, make_id: Callable[[], str],
                            defaults: Defaults, max_msg_bytes: int) -> tuple[NewSend, ...]:
    """importMsgBatch (docs/api.md, "Export and import"): sendMsgBatch's
    JSON body, strict always (an id stored before answers as stored,
    whatever it became), each message's `status` (1, 2, 3: pending, due at
    its trigger time; 5, 6: dead, as listDeadMsg shows it; default 1) and
    `retry` (the deliveries it had: 0..maxRetry, a dead one's to maxRetry +
    1; default 0) kept; validated whole as sendMsgBatch (`msgs[i].status`)."""
    check_size(body, limits.batch_body_bytes(max_msg_bytes))
    check_json_marks(body, limits.batch_json_marks, "the body")
    decoded = parse_json(body)
    items = decoded.get("msgs")
    if isinstance(items, list):
        limits.check_batch_msgs(len(items))
    sends = parse_send_batch({**decoded, "strictIdempotence": True}, now_ms=now_ms, make_id=make_id,
                             defaults=defaults, max_msg_bytes=max_msg_bytes)
    assert isinstance(items, list)  # (parse_send_batch refused anything else)
    out = []
    for i, (send, item) in enumerate(zip(sends, items)):
        status = _int(f"msgs[{i}].status", item.get("status"))
        status = 1 if status in (None, 2, 3) else status
        if status not in (1, 5, 6):
            raise InvalidRequest(f"msgs[{i}].status", f"must be 1, 2, 3 (pending) or 5, 6 (dead), got {status}")
        retry = _int(f"msgs[{i}].retry", item.get("retry")) or 0
        most = send.message.max_retry + (0 if status == 1 else 1)
        if not 0 <= retry <= most:
            raise InvalidRequest(f"msgs[{i}].retry", f"must be in 0..{most} (maxRetry{'' if status == 1 else ' + 1'} "
                                 f"for a {'pending' if status == 1 else 'dead'} message), got {retry}")
        out.append(send._replace(strict=True, kept=None if (status, retry) == (1, 0) else (status, retry)))
    return tuple(out)


def parse_form(raw: bytes) -> dict[str, str]:
    """application/x-www-form-urlencoded, strictly UTF-8: a bad byte is a
    400 naming the parameter it is in. The first of a repeated key wins."""
    out: dict[str, str] = {}
    if b"%" not in raw and b"+" not in raw:  # nothing escaped (most clients): no unquoting
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            pass  # the slow path names the parameter
        else:
            for pair in text.split("&"):
                if pair:
                    key, _, value = pair.partition("=")
                    out.setdefault(key, value)
            return out
    for escaped in raw.split(b"&"):
        if not escaped:
            continue
        key_raw, _, value_raw = escaped.partition(b"=")
        key = decode_utf8(unquote_plus(key_raw), "parameter name")
        out.setdefault(key, decode_utf8(unquote_plus(value_raw), key))
    return out


# "%xx" -> its byte, for every pair of hex digits of either case (as urllib.parse's)
_HEX_BYTES = {(a + b).encode(): bytes([int(a + b, 16)])
              for a in "0123456789abcdefABCDEF" for b in "0123456789abcdefABCDEF"}


def unquote_plus(raw: bytes) -> bytes:
    """A form's part unescaped: "+" a space, "%xx" its byte, a "%" not
    followed by two hex digits kept as it is -- as
    urllib.parse.unquote_to_bytes(raw.replace(b"+", b" ")), compiled (a
    form camellia's SDK sends escapes every quote of a JSON message)."""
    if b"+" in raw:
        raw = raw.replace(b"+", b" ")
    if b"%" not in raw:
        return raw
    chunks = raw.split(b"%")
    out = [chunks[0]]
    hex_bytes = _HEX_BYTES
    for chunk in chunks[1:]:
        byte = hex_bytes.get(chunk[:2])
        if byte is None:
            out.append(b"%")
            out.append(chunk)
        else:
            out.append(byte)
            out.append(chunk[2:])
    return b"".join(out)


# 19 digits in a row: a number orjson may read as a float where json keeps the int. Found as a run
# of 19 "0"s in the body with each ASCII digit made "0" and every other byte " " (bytes.translate and
# find: a tenth of the time of a regular expression's search, which counts each run of digits again
# from each of its places: 1 ms on a body of 500 messages).
_DIGITS_AS_ZEROS = bytes([0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256)])
_LONG_DIGITS = b"0" * 19


def has_long_digits(raw: bytes) -> bool:
    """Whether `raw` holds 19 ASCII digits in a row."""
    return raw.translate(_DIGITS_AS_ZEROS).find(_LONG_DIGITS) >= 0


def parse_json(raw: bytes) -> dict[str, object]:
    """A JSON object body. orjson (a fifth of json's time on a batch) where
    it reads the body as json would; json for the rest: what orjson refuses
    (NaN, lone surrogates) and bodies with integers of 19 digits or more
    (orjson makes floats of those past 64 bits, json keeps them exact)."""
    body: object
    if not has_long_digits(raw):
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(body, dict):
                return body
    text = decode_utf8(raw, "body")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidRequest("body", f"is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body", "must be a JSON object")
    return body


def _batch_form(raw: bytes, limits: BodyLimits) -> Params:
    """sendMsgBatch as a form: `topic` and `msgs` holding the JSON list."""
    limits.check_form(raw, "the form body")
    form = parse_form(raw)
    msgs = form.get("msgs")
    if msgs:
        check_json_marks(msgs, limits.batch_json_marks, "msgs")
        try:
            return {"topic": form.get("topic"), "msgs": json.loads(msgs)}
        except (ValueError, RecursionError) as e:
            raise InvalidRequest("msgs", f"is not valid JSON ({e})") from None
    return form


# ---------------------------------------------------------------- internals
# A helper reports the bare key (`ttlMillis`); a caller parsing an item of a
# batch prefixes it (`msgs[3].ttlMillis`, `_within`) only when one is
# raised, so a valid item builds no parameter names.

def _message(params: Params, where: str, topic: str, now_ms: int, make_id: Callable[[], str],
             defaults: Defaults, max_msg_bytes: int) -> NewMessage:
    """The message of sendMsg or of a sendMsgBatch item: every rule of a
    message's fields is here or in the helpers it calls, once. `where`
    (`msgs[3].`, or "") prefixes the parameter a refusal names; a valid
    item builds no parameter names. Each helper takes a JSON int, decimal
    digits and ASCII text first (ASCII text is as many bytes as
    characters)."""
    get = params.get
    msg_id, trigger, priority, tag, key = get("msgId"), get("triggerTime"), get("priority"), get("tag"), get("key")
    try:
        msg = _msg(get("msg"), max_msg_bytes)
        msg_id = _name("msgId", msg_id, True, False)
        delay_ms = _int("delayMillis", get("delayMillis"))  # validated even when triggerTime wins
        trigger_ms = _trigger_ms(now_ms, delay_ms, _int("triggerTime", trigger))
        ttl_ms = _defaulted(params, "ttlMillis", defaults.ttl_ms, defaults.max_ttl_ms)
        max_retry = _int("maxRetry", get("maxRetry"))
        if max_retry is None or max_retry < 0:
            max_retry = defaults.max_retry
        if max_retry >= MAX_RETRY_COUNT:  # retry counts deliveries: up to max_retry + 1
            max_retry = MAX_RETRY_COUNT - 1
        priority = _int("priority", priority)
        if priority is None:
            priority = 0
        elif not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", f"must be in {MIN_PRIORITY}..{MAX_PRIORITY}, got {priority}")
        tag = _name("tag", tag, False, True) or ""
        key = _name("key", key, True, False) or ""
        fair_key = get("fairKey")
        fair_key = "" if fair_key is None else _name("fairKey", fair_key, True, False, MAX_FAIR_KEY_BYTES) or ""
        traceparent, tracestate = trace_fields(get("traceparent"), get("tracestate"))
    except InvalidRequest as e:
        if where:
            raise _within(e, where) from None
        raise
    # tuple.__new__: NewMessage's own __new__ is Python code, a third of the cost here
    return tuple.__new__(NewMessage, (topic, make_id() if msg_id is None else msg_id, msg, now_ms, trigger_ms,
                                      ttl_ms, max_retry, priority, tag, key, traceparent, tracestate, fair_key))


def _trigger_ms(now_ms: int, delay_ms: int | None, trigger_ms: int | None) -> int:
    """The trigger time: `triggerTime` when given (absolute; in the past:
    floored at 0, due now), else `delayMillis` from now (<= 0 or not given:
    now, as camellia's server sets it). Past MAX_TRIGGER_MS is refused,
    naming whichever parameter produced it."""
    if trigger_ms is None:
        trigger_ms = now_ms + delay_ms if delay_ms is not None and delay_ms > 0 else now_ms
        if trigger_ms > MAX_TRIGGER_MS:
            raise InvalidRequest("delayMillis", f"puts the trigger time past {MAX_TRIGGER_MS} (year 9999)")
        return trigger_ms
    if trigger_ms > MAX_TRIGGER_MS:
        raise InvalidRequest("triggerTime", f"must be at most {MAX_TRIGGER_MS} (ms epoch), got {trigger_ms}")
    return trigger_ms if trigger_ms > 0 else 0


def _within(error: InvalidRequest, where: str) -> InvalidRequest:
    """The same refusal (InvalidRequest or MessageTooLarge), its parameter
    named inside `where` (`msgs[3].`)."""
    return type(error)(where + error.parameter, error.reason)


def _msg(value: object, max_msg_bytes: int) -> str:
    """`msg`: required, not empty, at most `max_msg_bytes` UTF-8 bytes."""
    if not isinstance(value, str):
        if value is None:
            raise InvalidRequest("msg", "is required and may not be empty")
        raise InvalidRequest("msg", f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidRequest("msg", "is required and may not be empty")
    size = len(value) if value.isascii() else _utf8_len(value, "msg")
    if size > max_msg_bytes:
        raise MessageTooLarge("msg", f"is {size} UTF-8 bytes, more than the limit of {max_msg_bytes}")
    return value


def _required_name(params: Params, parameter: str) -> str:
    """A top-level topic or msgId."""
    value = _name(parameter, params.get(parameter), True, False)
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


def _name(parameter: str, value: object, no_nul: bool = False, no_comma: bool = False,
          max_bytes: int = MAX_NAME_BYTES) -> str | None:
    """A topic, msgId, key, fairKey or tag: 1..`max_bytes` UTF-8 bytes, or
    None when not given; a topic, msgId or key holds no NUL, a tag no comma."""
    if not isinstance(value, str):
        if value is None:
            return None
        raise InvalidRequest(parameter, f"must be a string, got {type(value).__name__}")
    if not value:
        return None
    size = len(value) if value.isascii() else _utf8_len(value, parameter)
    if size > max_bytes:
        raise InvalidRequest(parameter, f"must be at most {max_bytes} UTF-8 bytes, got {size}")
    if no_nul and "\0" in value:
        raise InvalidRequest(parameter, "must not contain a NUL character")
    if no_comma and "," in value:
        raise InvalidRequest(parameter, "must not contain a comma (tag filters are comma lists)")
    return value


def _utf8_len(text: str, parameter: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, e.g. JSON "\ud800"
        raise InvalidRequest(parameter, "is not valid UTF-8 (lone surrogate)") from None


def _int(parameter: str, value: object) -> int | None:
    """A whole number, or None when not given."""
    if type(value) is int:  # JSON's, the common case first
        return value
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if len(value) < 19 and value.isdigit() and value.isascii():  # form digits: no regex needed
            return int(value)
        if _INTEGER.fullmatch(value):
            return int(value)
        raise InvalidRequest(parameter, f"must be a whole number, got {value[:40]!r}")
    if isinstance(value, bool):
        raise InvalidRequest(parameter, "must be a whole number, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise InvalidRequest(parameter, f"must be a whole number, got {value!r}")
    raise InvalidRequest(parameter, f"must be a whole number, got {type(value).__name__}")


def _defaulted(params: Params, parameter: str, default: int, maximum: int) -> int:
    """A positive duration or count: <= 0 or not given means `default`,
    above `maximum` means `maximum`."""
    value = params.get(parameter)
    if value is None:
        return default
    if type(value) is int:  # (JSON's, and a form's plain digits: `_int` without its call)
        number: int | None = value
    elif type(value) is str and 0 < len(value) < 19 and value.isdigit() and value.isascii():
        number = int(value)
    else:
        number = _int(parameter, value)
    if number is None or number <= 0:
        return default
    return number if number < maximum else maximum


def _bool(params: Params, parameter: str, default: bool) -> bool:
    value = params.get(parameter)
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
