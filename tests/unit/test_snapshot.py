"""Installing a snapshot (replication.snapshot): the new store is complete
and durable beside the old before anything is replaced, and a crash at any
step of the swap leaves, once `recover` has run, all of the old store or
all of the new one."""

from __future__ import annotations

import io
import os
import shutil
import tarfile

import pytest
from modes import open_to_others

from replication import snapshot
from storage.entry import MS_PER_HOUR, Status
from storage.errors import ContractError
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


def make_store(path, msg_ids: list[str], checkpoint: bool = True) -> None:
    store = Store.open(str(path), now_ms=NOW)
    store.send([NewMessage("t", i, f"body of {i}", NOW, NOW + 1000, 60_000, 3) for i in msg_ids], NOW)
    store.commit()
    if checkpoint:
        store.checkpoint(NOW)
    store.close()


def tar_of(path, out) -> str:
    store = Store.open(str(path), now_ms=NOW)
    try:
        files = snapshot.capture(str(path), store.log_segment_ends())
    finally:
        store.close()
    snapshot.write_tar(str(path), files, str(out))
    return str(out)


def ids_in(path) -> set[str]:
    store = Store.open(str(path), now_ms=NOW)
    try:
        return {i for i in ("old-1", "old-2", "new-1", "new-2") if store.get("t", i) is not None}
    finally:
        store.close()


@pytest.fixture
def dirs(tmp_path):
    """(a node's data dir holding an old store and an epochs file, a
    snapshot tar of another store)."""
    node, source = tmp_path / "node", tmp_path / "source"
    make_store(node, ["old-1", "old-2"])
    (node / "epochs").write_bytes(b"old epochs")
    make_store(source, ["new-1", "new-2"])
    return node, tar_of(source, tmp_path / "snapshot.tar")


def test_a_snapshot_replaces_the_store_and_the_files_given_with_it(dirs):
    node, tar = dirs
    staged = snapshot.unpack(tar, str(node))
    assert not os.path.exists(tar)
    assert ids_in(node) == {"old-1", "old-2"}  # the live store is untouched until the swap
    assert os.path.isdir(staged)
    snapshot.swap_in(str(node), {"epochs": b"new epochs"})
    snapshot.remove_replaced(str(node))
    assert ids_in(node) == {"new-1", "new-2"}
    assert (node / "epochs").read_bytes() == b"new epochs"
    assert sorted(os.listdir(node)) == ["checkpoint", "commitlog", "delay", "epochs", "ids", "keys"]


def test_a_snapshot_carries_the_end_times_a_dedup_window_reads(tmp_path):
    """The end index is derived from no other file: a node that installs
    a snapshot taken after the checkpoint that flushed it knows the ends."""
    node, source = tmp_path / "node", tmp_path / "source"
    make_store(node, ["old-1"])
    store = Store.open(str(source), now_ms=NOW)
    store.keep_ends("t", True)
    [sent] = store.send([NewMessage("t", "a", "x", NOW, NOW, 60_000, 3)], NOW)
    store.commit()
    store.update([StateChange(sent.message.location, Status.ACKED, 0)], NOW + 7)
    store.commit()
    store.checkpoint(NOW + 8)
    store.close()
    snapshot.unpack(tar_of(source, tmp_path / "s.tar"), str(node))
    snapshot.swap_in(str(node), {"epochs": b"new epochs"})
    snapshot.remove_replaced(str(node))
    store = Store.open(str(node), now_ms=NOW + 9)
    try:
        assert store.ended_at(sent.message.location, NOW + 9) == NOW + 7
    finally:
        store.close()


def test_an_unpacked_snapshot_never_swapped_in_is_dropped_at_start(dirs):
    node, tar = dirs
    snapshot.unpack(tar, str(node))
    snapshot.recover(str(node))  # the crash came before the swap began
    assert ids_in(node) == {"old-1", "old-2"}
    assert (node / "epochs").read_bytes() == b"old epochs"
    assert not os.path.exists(node / snapshot.UNPACKED)


class Crash(Exception):
    pass


def test_a_swap_cut_short_at_any_rename_is_finished_at_start(tmp_path, monkeypatch):
    source, pristine, node = tmp_path / "source", tmp_path / "pristine", tmp_path / "node"
    make_store(source, ["new-1", "new-2"])
    make_store(pristine, ["old-1", "old-2"])
    (pristine / "epochs").write_bytes(b"old epochs")
    # snapshot.new -> snapshot.swap, then each of the 5 entries (no ends/:
    # no dedup window kept an end) and the epochs file moved out of the way
    # and the new one moved in.
    renames = 1 + 2 * 6
    real = os.rename
    for crash_at in range(renames + 1):
        shutil.rmtree(node, ignore_errors=True)
        shutil.copytree(pristine, node)
        snapshot.unpack(tar_of(source, tmp_path / "s.tar"), str(node))
        done = 0

        def crashing(a, b, crash_at=crash_at):
            nonlocal done
            if done == crash_at:
                raise Crash(f"power lost before rename {crash_at}")
            done += 1
            real(a, b)

        monkeypatch.setattr(os, "rename", crashing)
        if crash_at < renames:
            with pytest.raises(Crash):
                snapshot.swap_in(str(node), {"epochs": b"new epochs"})
        else:
            snapshot.swap_in(str(node), {"epochs": b"new epochs"})
        monkeypatch.setattr(os, "rename", real)
        snapshot.recover(str(node))  # the next start
        if crash_at == 0:  # before the swap began: the old store, whole
            assert ids_in(node) == {"old-1", "old-2"} and (node / "epochs").read_bytes() == b"old epochs"
        else:
            assert ids_in(node) == {"new-1", "new-2"} and (node / "epochs").read_bytes() == b"new epochs"
        assert sorted(os.listdir(node)) == ["checkpoint", "commitlog", "delay", "epochs", "ids", "keys"]


def test_what_the_sender_had_none_of_does_not_survive_from_the_old_store(tmp_path):
    node, source = tmp_path / "node", tmp_path / "source"
    make_store(node, ["old-1", "old-2"])
    make_store(source, ["new-1", "new-2"], checkpoint=False)
    tar = tar_of(source, tmp_path / "s.tar")
    with tarfile.open(tar) as t:
        assert "checkpoint" not in t.getnames()
    snapshot.unpack(tar, str(node))
    snapshot.swap_in(str(node), {})
    assert ids_in(node) == {"new-1", "new-2"}  # the old checkpoint would have named the old hours


def test_a_bad_or_unreadable_snapshot_leaves_the_live_store_as_it_was(dirs, tmp_path):
    node, _ = dirs
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("../outside")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ContractError, match="is not a store file"):
        snapshot.unpack(str(bad), str(node))
    (tmp_path / "torn.tar").write_bytes(b"not a tar at all")
    with pytest.raises(tarfile.TarError):
        snapshot.unpack(str(tmp_path / "torn.tar"), str(node))
    assert not os.path.exists(node / snapshot.UNPACKED)
    assert ids_in(node) == {"old-1", "old-2"}


def test_an_installed_snapshot_is_private_whatever_modes_its_tar_gives(tmp_path):
    """A snapshot's files are 0600 in its tar; one from a leader of an
    older release gives 0644, which tarfile would set after the umask: a
    follower that installed it would then be refused at its next start."""
    node, source = tmp_path / "node", tmp_path / "source"
    make_store(node, ["old-1", "old-2"])
    make_store(source, ["new-1", "new-2"])
    tar = tar_of(source, tmp_path / "s.tar")
    with tarfile.open(tar) as t:
        assert {m.mode for m in t.getmembers()} == {0o600}
    older = tmp_path / "older.tar"
    with tarfile.open(tar) as t, tarfile.open(older, "w") as out:
        for member in t.getmembers():
            data = t.extractfile(member).read()
            member.mode = 0o644
            out.addfile(member, io.BytesIO(data))
    before = os.umask(0o022)
    try:
        snapshot.unpack(str(older), str(node))
        snapshot.swap_in(str(node), {"epochs": b"new epochs"})
        snapshot.remove_replaced(str(node))
    finally:
        os.umask(before)
    assert ids_in(node) == {"new-1", "new-2"}
    assert open_to_others(node) == []


def test_the_tar_holds_each_file_cut_at_its_size_and_leaves_out_one_deleted(tmp_path):
    """write_tar copies in the kernel: the archive is still a tar any reader
    takes, each member the file's first `size` bytes (all without one), and
    a file retired since the capture is left out."""
    data = tmp_path / "data"
    (data / "delay").mkdir(parents=True)
    (data / "commitlog").mkdir()
    contents = {"checkpoint": b"c" * 1000, "delay/a.idx": os.urandom(70_000), "commitlog/0.log": b"L" * 9000}
    for name, body in contents.items():
        (data / name).write_bytes(body)
    out = tmp_path / "out.tar"
    size = snapshot.write_tar(str(data), [("checkpoint", None), ("delay/a.idx", None), ("delay/gone.idx", None),
                                          ("commitlog/0.log", 4096)], str(out))
    assert size == out.stat().st_size and size % tarfile.RECORDSIZE == 0
    with tarfile.open(out) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == {"checkpoint": contents["checkpoint"], "delay/a.idx": contents["delay/a.idx"],
                   "commitlog/0.log": contents["commitlog/0.log"][:4096]}
