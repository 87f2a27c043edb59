"""Record framing shared by the commit log, the delay logs and the checkpoint.

A frame is a length, a checksum and an opaque body:

    offset  size  field
    0       4     body_length  u32 little-endian, > 0
    4       4     crc32        u32, zlib.crc32 of the body
    8       n     body         body_length bytes (msgpack in every user)

A frame whose length runs past the end of the file, or whose checksum does
not match, is *bad*; the caller decides whether a bad frame is a torn tail
(truncate it) or corruption (refuse), because only it knows what follows.
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import NamedTuple

from .errors import InvalidRequest

FRAME_HEADER = struct.Struct("<II")
FRAME_HEADER_BYTES = FRAME_HEADER.size
MAX_BODY_BYTES = 256 * 1024 * 1024


class FrameProblem(enum.Enum):
    OK = "ok"
    END = "end of data (zero length)"
    SHORT_HEADER = "frame header runs past the end"
    TOO_LONG = "body length runs past the end"
    BAD_CRC = "checksum mismatch"


class Frame(NamedTuple):
    problem: FrameProblem
    body: bytes | memoryview
    next_offset: int


def encode_frame(body: bytes) -> bytes:
    """Frame `body`. Refuses what `decode_frame` could not give back: an
    empty body (its frame is all zeros, read as the end of data) and one
    over MAX_BODY_BYTES (read as a torn tail)."""
    if not 0 < len(body) <= MAX_BODY_BYTES:
        raise InvalidRequest("body", f"must be 1..{MAX_BODY_BYTES} bytes, got {len(body)}")
    return FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


def decode_frame(buf, offset: int, end: int) -> Frame:
    """Decode the frame at `offset` of `buf` (bytes, bytearray or mmap),
    reading no further than `end`."""
    if offset + FRAME_HEADER_BYTES > end:
        return Frame(FrameProblem.SHORT_HEADER, b"", offset)
    length, crc = FRAME_HEADER.unpack_from(buf, offset)
    if length == 0:
        return Frame(FrameProblem.END, b"", offset)
    body_start = offset + FRAME_HEADER_BYTES
    body_end = body_start + length
    if length > MAX_BODY_BYTES or body_end > end:
        return Frame(FrameProblem.TOO_LONG, b"", offset)
    body = buf[body_start:body_end]
    if zlib.crc32(body) != crc:
        return Frame(FrameProblem.BAD_CRC, b"", offset)
    return Frame(FrameProblem.OK, body, body_end)


def find_valid_frame(buf, start: int, end: int) -> int | None:
    """The first offset in [start, end) where a well-formed frame begins, or
    None. Used after a bad frame to tell a torn tail (nothing valid after it)
    from corruption in the middle (valid records follow). Cost: one try per
    non-zero byte (and the 3 before it), so only the dirty region after the
    bad frame is scanned."""
    pos = start
    while pos < end:
        if buf[pos] == 0:
            # Skip zero runs quickly: a frame never has length 0. The length
            # is little-endian, so its low bytes may be zero (a 256-byte body)
            # and the frame may start up to 3 bytes before the non-zero one.
            nxt = _next_nonzero(buf, pos, end)
            if nxt is None:
                return None
            for candidate in range(max(pos, nxt - 3), nxt):
                if decode_frame(buf, candidate, end).problem is FrameProblem.OK:
                    return candidate
            pos = nxt
        frame = decode_frame(buf, pos, end)
        if frame.problem is FrameProblem.OK:
            return pos
        pos += 1
    return None


def _next_nonzero(buf, start: int, end: int) -> int | None:
    chunk = 1 << 16
    pos = start
    while pos < end:
        stop = min(end, pos + chunk)
        piece = bytes(buf[pos:stop])
        stripped = piece.lstrip(b"\0")
        if stripped:
            return pos + (len(piece) - len(stripped))
        pos = stop
    return None
