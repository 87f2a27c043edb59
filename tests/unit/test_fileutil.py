"""Error paths of storage.fileutil and storage.files: a syncfs that reports
a write-back error fails the checkpoint; a full disk while reserving a
mapped file's blocks is an error, never a sparse file."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from storage import files, fileutil
from storage.entry import MS_PER_HOUR
from storage.files import MappedFile
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


class FakeLibc:
    """Stands in for libc: syncfs fails with `error` (0: succeeds)."""

    def __init__(self, error: int) -> None:
        self.error = error
        self.calls = 0

    def syncfs(self, fd: int) -> int:
        self.calls += 1
        if self.error:
            ctypes.set_errno(self.error)
            return -1
        return 0


def a_store_with_a_checkpoint(path) -> Store:
    store = Store.open(str(path), now_ms=NOW)
    store.send([NewMessage("t", "a", "body", NOW, NOW + 1000, 60_000, 3)], NOW)
    store.checkpoint(NOW)
    store.send([NewMessage("t", "b", "body", NOW, NOW + 2000, 60_000, 3)], NOW)
    return store


def test_an_eio_from_syncfs_fails_the_checkpoint(tmp_path, monkeypatch):
    store = a_store_with_a_checkpoint(tmp_path)
    checkpoint_before = (tmp_path / "checkpoint").read_bytes()
    libc = FakeLibc(errno.EIO)
    monkeypatch.setattr(fileutil, "_libc", libc)
    synced = []
    monkeypatch.setattr(fileutil, "fsync_tree", synced.append)
    try:
        with pytest.raises(OSError, match="syncfs of the data directory") as caught:
            store.checkpoint(NOW)
        assert caught.value.errno == errno.EIO
        assert caught.value.filename == str(tmp_path)  # for the log; a failed node's /health shows the repr:
        assert str(tmp_path) not in repr(caught.value)
        assert libc.calls == 1 and synced == []  # no fallback hides it
        assert (tmp_path / "checkpoint").read_bytes() == checkpoint_before  # nothing recorded as durable
    finally:
        monkeypatch.setattr(fileutil, "_libc", FakeLibc(0))
        store.close()


def test_only_a_missing_syncfs_falls_back_to_fsyncing_every_file(tmp_path, monkeypatch):
    monkeypatch.setattr(fileutil, "_libc", FakeLibc(errno.ENOSYS))
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                  real_fsync(fd)))
    store = a_store_with_a_checkpoint(tmp_path)
    try:
        fsynced.clear()
        store.checkpoint(NOW)
    finally:
        store.close()
    assert {os.path.relpath(p, tmp_path) for p in fsynced} >= {"checkpoint", "ids/00.hix", "ids/secret",
                                                                "commitlog/" + os.listdir(tmp_path / "commitlog")[0]}


def full_disk(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_growing_a_mapped_file_raises_and_the_file_stays_usable(tmp_path, monkeypatch):
    path = str(tmp_path / "mapped")
    f = MappedFile(path, create=True, min_bytes=4096)
    try:
        f.write(0, b"kept")
        monkeypatch.setattr(os, "posix_fallocate", full_disk)
        with pytest.raises(OSError, match="No space left on device") as caught:
            f.write(4000, b"x" * 200)  # needs 8 KiB
        assert caught.value.errno == errno.ENOSPC
        assert os.path.getsize(path) == 4096  # not grown sparse
        assert f.read(0, 4) == b"kept"  # the old mapping is intact
        f.write(8, b"more")
        monkeypatch.undo()
        f.write(4000, b"x" * 200)
        assert f.read(4000, 200) == b"x" * 200
    finally:
        f.close()


def test_a_full_disk_while_creating_a_mapped_file_raises_and_leaks_no_descriptor(tmp_path, monkeypatch):
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        files.MappedFile(str(tmp_path / "new"), create=True)
    assert len(os.listdir("/proc/self/fd")) == before
