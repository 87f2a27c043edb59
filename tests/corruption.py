"""Shared by the crash and corruption tests: damage a file on purpose."""

from __future__ import annotations


def xor_byte(path: str, position: int, mask: int) -> None:
    """Flip the bits of `mask` in the byte at `position` of `path`."""
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(1)[0]
        f.seek(position)
        f.write(bytes([old ^ mask]))


def commit_log_frame(path: str, position: int, body: bytes) -> bytes:
    """A frame of `body` that the commit-log segment `path` (version 2) reads
    as a valid record at file `position`: its checksum seeded with the
    segment's salt and the record's offset, as an append would write it."""
    from storage.commit_log import HEADER_BYTES, SEGMENT_HEADER
    from storage.framing import encode_frame, frame_seed

    with open(path, "rb") as f:
        _, version, _, base, salt, _ = SEGMENT_HEADER.unpack(f.read(HEADER_BYTES))
    assert version == 2, f"{path} is a version {version} segment"
    return encode_frame(body, frame_seed(salt, base + position - HEADER_BYTES))
