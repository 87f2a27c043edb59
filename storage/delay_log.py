"""Hour delay log: the bodies of every message triggering in one UTC hour.

File `delay/<hour:010d>.log`, appended in arrival order:

    offset  size  field
    0       4     magic     b"HGDL"
    4       2     version   u16 = 1
    6       2     reserved  0
    8       8     hour      u64: UTC hours since the epoch
    16      ...   frames, each starting on a multiple of 8 bytes:
                    u32 body_length | u32 crc32(body) | body | zero padding
                  body = msgpack [topic, msgId, msg, produceTime, ttlMillis,
                                  maxRetry, tag] or, for a message with a
                         serial key, [..., tag, key] (8 items); for a
                         message with trace context, that array followed
                         by a second one: [traceparent, tracestate]; for
                         a message re-driven (redriveMsgs), then a
                         positive int: its redriveCount; for a message
                         with a fairKey, then a non-empty str: it

A body without trace context (docs/api.md, "Trace context") ends with its
first array, as every body did before trace context was kept: it costs no
byte more, its first byte still tells a keyed body (0x98, KEYED_BODY of
storage.key_index) from a plain one (0x97), and a body of an older log
reads as it did. `tracestate` is "" when the sender gave none. (A node
from before trace context refuses a body carrying one: msgpack's
ExtraData.)

`redriveCount` (docs/api.md, "Re-driving by filter") is written only once a
message was re-driven by a redriveMsgs job: a body without it (every body
of an older log) reads as 0, and the first byte still tells a keyed body
from a plain one.

`fairKey` (docs/api.md, "Fairness between tenants") is written only when
the sender gave one, after the redriveCount if any: a body without it
(every body of an older log) reads as "". The three trailers tell
themselves apart by their msgpack type (array, positive int, string).

An index entry points at a frame by `offset // 8` (u32, so an hour's log
may reach 32 GiB) and the frame's length without padding.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgpack

from .errors import ContractError, CorruptionError
from .fileutil import check_header
from .framing import FRAME_HEADER, FRAME_HEADER_BYTES, Buffer, FrameProblem, decode_frame

HEADER = struct.Struct("<4sHHQ")
MAGIC = b"HGDL"
VERSION = 1
HEADER_BYTES = HEADER.size
ALIGN_BYTES = 8
_PAD = bytes(ALIGN_BYTES)


class Body(NamedTuple):
    topic: str
    msg_id: str
    msg: str
    produce_ms: int
    ttl_ms: int
    max_retry: int
    tag: str
    key: str = ""  # the serial key (SPEC: `key`); "" none
    traceparent: str = ""  # W3C trace context the sender gave (broker.core.trace_context); "" none
    tracestate: str = ""
    redrive_count: int = 0  # times a redriveMsgs job put it back (docs/api.md); 0 none
    fair_key: str = ""  # the tenant fairness groups by (docs/api.md, "Fairness between tenants"); "" none


def pack_body(topic: str, msg_id: str, msg: str, produce_ms: int, ttl_ms: int, max_retry: int, tag: str,
              key: str = "", traceparent: str = "", tracestate: str = "", redrive_count: int = 0,
              fair_key: str = "") -> bytes:
    packed: bytes
    if key:
        packed = _pack((topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key))
    else:
        packed = _pack((topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag))
    if traceparent:
        packed += _pack((traceparent, tracestate))
    if redrive_count:
        packed += _pack(redrive_count)
    if fair_key:
        packed += _pack(fair_key)
    return packed


def redriven(body: Buffer) -> bytes:
    """`body` with its redriveCount one more (a redriveMsgs job's move)."""
    b = unpack_body(body)
    return pack_body(b.topic, b.msg_id, b.msg, b.produce_ms, b.ttl_ms, b.max_retry, b.tag, b.key, b.traceparent,
                     b.tracestate, b.redrive_count + 1, b.fair_key)


# msgpack.packb's own packer, made once (packb makes one a call, in Python)
_pack = msgpack.Packer().pack


def unpack_body(body: Buffer) -> Body:
    try:
        return Body(*msgpack.unpackb(body))
    except msgpack.ExtraData as more:  # the trace context, a redriveCount, a fairKey, after the fields
        return _trailed(more.unpacked, more.extra)


def _trailed(fields: list[Any], extra: bytes) -> Body:
    """The Body of `fields` and what is packed after them: the trace
    context's array, then a redriveCount, then a fairKey, each optional,
    in that order."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(extra)
    try:
        after = list(unpacker)
    except (ValueError, msgpack.UnpackException) as e:
        raise ContractError(f"delay-log body ends with {extra[:16]!r}: {e}") from e
    trace: list[Any] = ["", ""]
    count = 0
    if after and type(after[0]) is list:
        trace = after.pop(0)
        if len(trace) != 2 or not all(type(t) is str for t in trace) or not trace[0]:
            raise ContractError(f"delay-log body ends with {extra[:16]!r}, not a [traceparent, tracestate] array")
    if after and type(after[0]) is int and after[0] > 0:
        count = after.pop(0)
    fair_key = ""
    if after and type(after[0]) is str and after[0]:
        fair_key = after.pop(0)
    if after or unpacker.tell() != len(extra):
        raise ContractError(f"delay-log body ends with {extra[:16]!r}, not a trace context array, a "
                            f"redriveCount and a fairKey")
    if len(fields) == 7:
        fields.append("")  # no serial key
    return Body._make((*fields, *trace, count, fair_key))


def serial_key(body: Buffer) -> tuple[str, str]:
    """A body's (topic, serial key); the key "" when it has none."""
    try:
        fields = msgpack.unpackb(body)
    except msgpack.ExtraData as more:  # trace context follows
        fields = more.unpacked
    return fields[0], fields[7] if len(fields) == 8 else ""


def id_fields(body: Buffer) -> tuple[bytes, bytes]:
    """The UTF-8 bytes of a body's topic and msgId, read from the front of
    the msgpack array without decoding the message (the id index hashes
    them when it applies a record or is rebuilt)."""
    if body[0] not in (0x97, 0x98):  # a fixarray of 7 (or 8: with a key)
        raise ContractError(f"delay-log body starts with {body[0]:#x}, not a 7- or 8-item array")
    topic, at = _str_at(body, 1)
    msg_id, _ = _str_at(body, at)
    return topic, msg_id


def _str_at(body: Buffer, at: int) -> tuple[bytes, int]:
    """The msgpack str at `at`: (its bytes, where the next item starts)."""
    tag = body[at]
    if 0xA0 <= tag <= 0xBF:
        length, start = tag & 0x1F, at + 1
    elif tag == 0xD9:
        length, start = body[at + 1], at + 2
    elif tag == 0xDA:
        length, start = int.from_bytes(body[at + 1:at + 3], "big"), at + 3
    elif tag == 0xDB:
        length, start = int.from_bytes(body[at + 1:at + 5], "big"), at + 5
    else:
        raise ContractError(f"delay-log body holds {tag:#x} at {at}, not a string")
    if start + length > len(body):
        raise ContractError(f"delay-log body string at {at} runs past its end")
    return bytes(body[start:start + length]), start + length


def header_bytes(hour: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, hour)


def check_file_header(path: str, buf: bytes, hour: int) -> None:
    fields = check_header(path, buf, HEADER, MAGIC, VERSION)
    if fields[3] != hour:
        raise CorruptionError(path, 8, f"header says hour {fields[3]}, file name says {hour}")


def padded_bytes(frame_bytes: int) -> int:
    """The bytes a frame of `frame_bytes` takes in the log: rounded up to a
    multiple of ALIGN_BYTES (the next frame starts there)."""
    return -(-frame_bytes // ALIGN_BYTES) * ALIGN_BYTES


def append_frame(buf: bytearray, body: bytes) -> int:
    """Append `body` framed (storage.framing, seed 0) and zero-padded to
    `padded_bytes` to `buf`, in place; returns the bytes it takes in the
    log (`append_frames` of one body: the frame written in one place)."""
    return append_frames(buf, (body,))


def append_frames(buf: bytearray, bodies: Iterable[bytes]) -> int:
    """`append_frame` of each body, in order; returns the last one's bytes in
    the log (0 if none)."""
    header, crc, pad_bytes = FRAME_HEADER.pack, zlib.crc32, _PAD
    taken = 0
    for body in bodies:
        buf += header(len(body), crc(body))
        buf += body
        size = FRAME_HEADER_BYTES + len(body)
        pad = -size & (ALIGN_BYTES - 1)
        if pad:
            buf += pad_bytes[:pad]
        taken = size + pad
    return taken


def decode_body_frame(path: str, raw: bytes, offset: int) -> bytes:
    """The body of the frame held in `raw` (read from `offset` of `path`)."""
    frame = decode_frame(raw, 0, len(raw))
    if frame.problem is not FrameProblem.OK:
        raise CorruptionError(path, offset, f"delay log frame: {frame.problem.value}")
    return bytes(frame.body)

