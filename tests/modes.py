"""Shared by the tests of a data directory's privacy (storage.data_dir):
what group or others may reach under a directory, and a small file system
mounted read-only."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Callable, Iterator

import pytest


def open_to_others(root: str | os.PathLike[str]) -> list[str]:
    """"MODE path" of `root` and of every file and directory under it that
    group or others have any permission on (paths relative to `root`)."""
    found = []
    for directory, _, names in os.walk(root):
        for path in (directory, *(os.path.join(directory, n) for n in names)):
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & 0o077:
                found.append(f"{mode:04o} {os.path.relpath(path, root)}")
    return found


def everything_under(root: str | os.PathLike[str]) -> set[str]:
    """Every file and directory under `root`, relative to it."""
    found: set[str] = set()
    for directory, dirs, names in os.walk(root):
        found.update(os.path.relpath(os.path.join(directory, n), root) for n in (*dirs, *names))
    return found


@contextlib.contextmanager
def read_only_tmpfs(mount_point: str | os.PathLike[str], fill: Callable[[str], None]) -> Iterator[str]:
    """A 16 MiB tmpfs at `mount_point`, `fill(mount_point)` run while it is
    writable, then remounted read-only; unmounted afterwards. Skips the
    test unless this process may mount one (root)."""
    os.makedirs(mount_point, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (as another user, a chmod 500 directory is the read-only case)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        fill(str(mount_point))
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
