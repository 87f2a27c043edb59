"""What one touch of a mapped file makes resident, with and without
read-around: a file preallocated, written through its mapping page by
page (as the store's hours and commit log are), its pages dropped from
the mapping (as a shed does), then three one-byte reads and one write at
distant places; and the same for a file written through write() in 1 MB
calls (as an index shard's doubling once was). Prints ONE JSON object:
the mapping's resident kB after the reads and after the write, each way
(docs/internals.md, "Writing": on kernels whose page cache holds large
folios, a touch maps its whole folio).

    .venv/bin/python bench/mapped_touch.py [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import tempfile

SIZE = 64 << 20
READS = (5 << 20, 17 << 20 | 4096, 33 << 20)
WRITE = 41 << 20


def resident_kb(path: str) -> int:
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:
                inside = len(fields) >= 6 and fields[5] == path
            elif inside and fields and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def touch(directory: str, written_by: str, advice: int | None) -> dict[str, int]:
    path = os.path.join(directory, f"touch-{written_by}-{advice}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, SIZE)
        if written_by == "write":
            for offset in range(0, SIZE, 1 << 20):
                os.pwrite(fd, b"x" * (1 << 20), offset)
        mm = mmap.mmap(fd, SIZE)
        if advice is not None:
            mm.madvise(advice)
        if written_by == "mapping":
            for offset in range(0, SIZE, mmap.PAGESIZE):
                mm[offset] = 1
        mm.madvise(mmap.MADV_DONTNEED)
        for offset in READS:
            _ = mm[offset]
        after_reads = resident_kb(path)
        mm[WRITE] = 7
        after_write = resident_kb(path)
        mm.close()
        return {"after_3_reads_kb": after_reads, "after_1_write_kb": after_write}
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where the test files go (default: the temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        result = {"kernel": platform.release()}
        for written_by in ("mapping", "write"):
            for name, advice in (("read_around", None), ("random", mmap.MADV_RANDOM)):
                result[f"written_by_{written_by}_{name}"] = touch(directory, written_by, advice)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
