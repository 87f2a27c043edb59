"""Shared by the crash and corruption tests: damage a file on purpose."""

from __future__ import annotations


def xor_byte(path: str, position: int, mask: int) -> None:
    """Flip the bits of `mask` in the byte at `position` of `path`."""
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(1)[0]
        f.seek(position)
        f.write(bytes([old ^ mask]))
