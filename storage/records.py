"""Commit-log record bodies: what one state change looks like in the log.

Every body is a msgpack array `[kind, now_ms, items]`:

    SEND   items: [hour, global_index, pre_global_index, local_index, second,
                   log_offset8, frame_size, trigger_ms, priority, topic_hash,
                   tag_hash, key, body]
           (body is the delay-log body, see storage.delay_log; key is the
           writer's id-index key, kept for the record's layout only: the id
           index is keyed by each store's own secret, so a store applying a
           record read back from a log or sent by a leader hashes the body's
           topic and msgId again, see Store._decode)
    STATE  items: [hour, global_index, status, retry, flags, prev_status,
                   topic_hash, deadline_ms, delivery]
           (prev_status and topic_hash keep the per-topic status counts
           exact on replay, whatever the index file already holds;
           deadline_ms, for a change to CONSUMING, is its ack deadline, so
           a follower that takes over redelivers it on time; 0 otherwise,
           and absent from records written before it existed; delivery,
           for a change to CONSUMING, the hand-over it is -- a pull's new
           one, an extension's kept --, so an ack fenced by it is judged
           alike after a restart or on a new leader; 0 otherwise, and
           absent from records written before it existed)
    MOVE   items: [from_hour, from_global_index, prev_status, retry,
                   [a SEND item]]
           (a message filed again: a waiting one of a due span, see
           storage.spans, or one given a new trigger time by a reschedule
           or a re-drive: its new coordinates and whole body, so applying
           it never reads the old file. The old entry becomes status 7,
           released, flag MOVED, counted as ended for its file and for no
           topic; the new one is WAITING with `retry`)
    PART   items: [[call id, [a STATE item, ...]]]
           (a slice of one large bulk call's status changes, held -- not
           applied -- until the COMMIT record of its call id: a call too
           large for one turn of the event loop appends a PART a slice,
           other requests served between, and stays whole all the same)
    COMMIT items: [call id]
           (applies the held PARTs of that call id, in log order; the PARTs
           of other calls stay held -- calls run at once, their PARTs
           interleaved --; call id 0 drops every PART held: a node that
           starts to serve appends it, so a call whose COMMIT never came --
           its node was killed or deposed -- is abandoned whole)
    INTENT items: [[call id, topic, shift_ms or nil, trigger_ms or nil,
                    places]]
           (a large rescheduleMsgs taken: every place it matched --
           `places`, little-endian i64 pairs (hour, globalIndex) -- and its
           new trigger time, a shift of each message's or one for all. Held
           until the DONE of its call id; the call's moves follow as
           ordinary MOVE records, a slice at a time, and a node that starts
           to serve -- after a crash, or a new leader -- carries out what
           it holds of one (the places not moved yet, as they then are), so
           the call, once its INTENT is durable, takes effect whole)
    DONE   items: [call id]
           (the call of that INTENT is carried out: its intent is dropped)

A record carries every coordinate it was given at append time, so applying
it is a set of writes at fixed positions: replaying a record twice, or
over files that already hold part of it, gives the same bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import msgpack


class Kind(enum.IntEnum):
    SEND = 1
    STATE = 2
    MOVE = 3
    PART = 4
    COMMIT = 5
    INTENT = 6
    DONE = 7


class SendItem(NamedTuple):
    hour: int
    global_index: int
    pre_global_index: int
    local_index: int
    second: int
    log_offset8: int
    frame_size: int
    trigger_ms: int
    priority: int
    topic_hash: int
    tag_hash: int
    key: int
    body: bytes


class StateItem(NamedTuple):
    hour: int
    global_index: int
    status: int
    retry: int
    flags: int
    prev_status: int
    topic_hash: int
    deadline_ms: int = 0
    delivery: int = 0


class MoveItem(NamedTuple):
    from_hour: int
    from_global_index: int
    prev_status: int
    retry: int
    to: SendItem


class PartItem(NamedTuple):
    call_id: int
    items: list[StateItem]


class CommitItem(NamedTuple):
    call_id: int  # 0: no call; every PART held is dropped (also a DONE's item)


class IntentItem(NamedTuple):
    call_id: int
    topic: str
    shift_ms: int | None  # each message's trigger time moved by this; or
    trigger_ms: int | None  # every message's new trigger time
    places: bytes  # little-endian i64 pairs: (hour, globalIndex) of each place matched


# One item of a record; a record's items are all of its kind's type.
Item = SendItem | StateItem | MoveItem | PartItem | CommitItem | IntentItem


def encode(kind: Kind, now_ms: int, items: Sequence[Item]) -> bytes:
    body: bytes = _pack((int(kind), now_ms, items))
    return body


# msgpack.packb's own packer, made once (packb makes one a call, in Python)
_pack = msgpack.Packer().pack


def decode(body: bytes) -> tuple[Kind, int, Sequence[Item]]:
    kind, now_ms, items = msgpack.unpackb(body)
    kind = Kind(kind)
    if kind is Kind.MOVE:
        return kind, now_ms, [MoveItem(f, g, p, r, SendItem(*to)) for f, g, p, r, to in items]
    if kind is Kind.PART:
        return kind, now_ms, [PartItem(call_id, [StateItem(*item) for item in part]) for call_id, part in items]
    if kind is Kind.COMMIT or kind is Kind.DONE:
        return kind, now_ms, [CommitItem(*item) for item in items]
    if kind is Kind.INTENT:
        return kind, now_ms, [IntentItem(*item) for item in items]
    make = SendItem if kind is Kind.SEND else StateItem
    return kind, now_ms, [make(*item) for item in items]
