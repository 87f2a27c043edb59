"""The drill's slow disk: `hourglass` run with every fsync and fdatasync
it makes delayed by what a control file says (docs/drills.md).

    python -m bench.drill_slow_disk CONTROL serve --data-dir d --port 8080 ...

Run from the project root, as `python -m broker.cli` is (bench/harness.py,
`serve_command`): the folder run from is first on the import path, so
the broker imported is the one `-m broker.cli` there would run. The
drills run it by its path from `python -c` (bench/drill_nodes.py,
SLOW_DISK_LAUNCHER), which does the same, and under PYTHONSAFEPATH (the
compiled runs of `bash .ci/run`) imports the installed build as
`-m broker.cli` then does.

CONTROL holds a whole number of milliseconds; absent, empty or 0 means no
delay. Each fsync or fdatasync looks at the file's identity (inode, size,
mtime) and reads it again only when that changed, so the drill switches
the delay on and off while the node runs by replacing the file
(`set_delay`). The delay is a sleep before the real call, in the thread
that makes it: a syncer thread waits as on a slow device while the event
loop goes on, and a call made on the loop holds the loop as a slow disk
would. Writes, reads and mmap flushes are not slowed: this stands in for
a device whose cache flushes are slow, which is what the commit path
waits on (a device mapper's dm-delay or a FUSE file system would slow
every I/O, and need root). The broker's code is not changed: this module
replaces `os.fsync` and `os.fdatasync` before it imports the broker, then
runs `broker.cli.main` with the rest of the command line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

MAX_DELAY_MS = 60_000
FD = TypeVar("FD")  # what os.fsync takes: a descriptor or an object with fileno()


def set_delay(control: str, delay_ms: int) -> None:
    """Make every later fsync of the node reading `control` wait `delay_ms`
    first (0: none). Atomic: a new file renamed over the old one."""
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        raise ValueError(f"delay_ms must be within 0..{MAX_DELAY_MS}, got {delay_ms}")
    temp = f"{control}.new"
    with open(temp, "w") as f:
        f.write(str(delay_ms))
    os.replace(temp, control)


class Delay:
    """The delay CONTROL asks for now, read again when the file changes."""

    def __init__(self, control: str) -> None:
        self.control = control
        self._stamp: tuple[int, int, int] | None = None
        self._seconds = 0.0
        self._lock = threading.Lock()  # fsyncs come from several threads

    def __repr__(self) -> str:
        return f"Delay({self.control!r}, {self._seconds * 1000:g} ms)"

    def seconds(self) -> float:
        try:
            st = os.stat(self.control)
        except OSError:
            return 0.0
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if stamp != self._stamp:
                self._stamp, self._seconds = stamp, self._read()
            return self._seconds

    def _read(self) -> float:
        try:
            with open(self.control) as f:
                text = f.read().strip()
            return min(max(int(text or 0), 0), MAX_DELAY_MS) / 1000
        except (OSError, ValueError):
            return 0.0


def delayed(call: Callable[[FD], None], delay: Delay) -> Callable[[FD], None]:
    def wait_then(fd: FD) -> None:
        seconds = delay.seconds()
        if seconds:
            time.sleep(seconds)
        call(fd)

    wait_then.__name__ = call.__name__
    return wait_then


def main(argv: list[str]) -> int:
    if len(argv) < 1:
        sys.exit("usage: python -m bench.drill_slow_disk CONTROL hourglass-arguments...")
    delay = Delay(argv[0])
    for name in ("fsync", "fdatasync"):
        setattr(os, name, delayed(getattr(os, name), delay))
    from broker.cli import main as hourglass

    return hourglass(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
