"""Record framing shared by the commit log and the delay logs.

A frame is a length, a checksum and an opaque body:

    offset  size  field
    0       4     body_length  u32 little-endian, > 0
    4       4     crc32        u32: zlib.crc32(body, seed)
    8       n     body         body_length bytes (msgpack in every user)

`seed` makes the checksum cover more than the body. The commit log (segment
version 2) seeds each frame with `frame_seed(salt, offset)`: the CRC of the
frame's own logical offset and of a random salt kept in the segment's
header, so a frame is valid only where it was written. A message whose body
holds bytes that look like a frame (length, CRC, body) therefore never
passes for a record when recovery scans a torn tail: the sender can neither
know the salt nor place the copy at the offset it was made for. Seed 0 is
the plain crc32 of the body: delay logs (their frames are reached through
the index, never found by scanning) and version 1 commit-log segments.

A frame whose length runs past the end of the file, or whose checksum does
not match, is *bad*; the caller decides whether a bad frame is a torn tail
(truncate it) or corruption (refuse), because only it knows what follows.
"""

from __future__ import annotations

import enum
import mmap
import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

from .errors import InvalidRequest

FRAME_HEADER = struct.Struct("<II")
FRAME_HEADER_BYTES = FRAME_HEADER.size
MAX_BODY_BYTES = 256 * 1024 * 1024
SEED = struct.Struct("<QI")  # logical offset, salt
# What frames are read from: a file's bytes, a bytearray, a mapping, a view.
Buffer = bytes | bytearray | memoryview | mmap.mmap


class FrameProblem(enum.Enum):
    OK = "ok"
    END = "end of data (zero length)"
    SHORT_HEADER = "frame header runs past the end"
    TOO_LONG = "body length runs past the end"
    BAD_CRC = "checksum mismatch"


class Frame(NamedTuple):
    problem: FrameProblem
    body: bytes | bytearray | memoryview
    next_offset: int


def frame_seed(salt: int, offset: int) -> int:
    """The checksum seed of the frame at logical `offset` of a file salted
    with `salt` (see the module docstring)."""
    return zlib.crc32(SEED.pack(offset, salt))


def encode_frame(body: bytes, seed: int = 0) -> bytes:
    """Frame `body`. Refuses what `decode_frame` could not give back: an
    empty body (its frame is all zeros, read as the end of data) and one
    over MAX_BODY_BYTES (read as a torn tail)."""
    if not 0 < len(body) <= MAX_BODY_BYTES:
        raise InvalidRequest("body", f"must be 1..{MAX_BODY_BYTES} bytes, got {len(body)}")
    return FRAME_HEADER.pack(len(body), zlib.crc32(body, seed)) + body


def encode_salted_frame(body: bytes, salt: int, offset: int) -> bytes:
    """`encode_frame(body, frame_seed(salt, offset))` in one call (a
    commit-log append's)."""
    if not 0 < len(body) <= MAX_BODY_BYTES:
        raise InvalidRequest("body", f"must be 1..{MAX_BODY_BYTES} bytes, got {len(body)}")
    return FRAME_HEADER.pack(len(body), zlib.crc32(body, zlib.crc32(SEED.pack(offset, salt)))) + body


def decode_frame(buf: Buffer, offset: int, end: int, seed: int = 0) -> Frame:
    """Decode the frame at `offset` of `buf` (bytes, bytearray or mmap),
    reading no further than `end`; `seed` as it was encoded with."""
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
    if zlib.crc32(body, seed) != crc:
        return Frame(FrameProblem.BAD_CRC, b"", offset)
    return Frame(FrameProblem.OK, body, body_end)


def find_valid_frame(buf: Buffer, start: int, end: int, seed_at: Callable[[int], int] | None = None) -> int | None:
    """The first offset in [start, end) where a well-formed frame begins, or
    None; `seed_at(position)` gives the seed a frame there was encoded with
    (default: 0). Used after a bad frame to tell a torn tail (nothing valid
    after it) from corruption in the middle (valid records follow). Cost:
    one try per non-zero byte (and the 3 before it), so only the dirty
    region after the bad frame is scanned."""
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
                if _valid_at(buf, candidate, end, seed_at):
                    return candidate
            pos = nxt
        if _valid_at(buf, pos, end, seed_at):
            return pos
        pos += 1
    return None


def _valid_at(buf: Buffer, pos: int, end: int, seed_at: Callable[[int], int] | None) -> bool:
    if seed_at is None:
        return decode_frame(buf, pos, end).problem is FrameProblem.OK
    if pos + FRAME_HEADER_BYTES > end:
        return False
    length = FRAME_HEADER.unpack_from(buf, pos)[0]
    if not 0 < length <= min(MAX_BODY_BYTES, end - pos - FRAME_HEADER_BYTES):
        return False  # no seed to compute for what cannot be a frame
    return decode_frame(buf, pos, end, seed_at(pos)).problem is FrameProblem.OK


def _next_nonzero(buf: Buffer, start: int, end: int) -> int | None:
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
