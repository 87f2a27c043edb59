"""broker.node.server's keep_malloc_lean: glibc's mmap threshold stays fixed, so
a large block freed does not make the next ones come from the heap (where
their holes stay resident among what the node keeps); an environment that
sets malloc's parameters itself is left alone. Each case in a fresh
interpreter: malloc's parameters are the process's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Prints how many blocks of their own (mmapped) a 1 MiB allocation made, after a
# 4 MiB block was freed (glibc's default then raises its threshold past 1 MiB).
# keep_malloc_lean first, as the node calls it when it starts.
_PROBE = """
import ctypes
from broker.node.server import keep_malloc_lean
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if LEAN:
    keep_malloc_lean()
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblks
block = bytearray(1 << 20)
print(libc.mallinfo2().hblks - before)
"""


def _probe(lean: bool, **env: str) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", f"LEAN = {lean}\n" + _PROBE], env={**clean, **env},
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


@pytest.fixture(autouse=True)
def _glibc_only():
    import ctypes
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later: no mallinfo2 to read the blocks with")


def test_a_large_block_after_a_larger_one_freed_is_its_own_mapping():
    assert _probe(lean=False) == 0  # glibc's default: the threshold rose, the block came from the heap
    assert _probe(lean=True) == 1


def test_an_environment_that_sets_malloc_is_left_alone():
    assert _probe(lean=True, MALLOC_ARENA_MAX="4") == 0
