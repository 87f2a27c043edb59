"""`hourglass backup` and `hourglass restore` (docs/operations.md, "Backup
and restore").

A backup is a directory:

    manifest.json          written last: the format, the shard count, each
                           shard's log position, and every file's size and
                           SHA-256 (of its bytes as written here)
    shard-<i>/...          shard i's store and small files, as its node
                           sent them (GET backupShard on the shard's own
                           port, storage.backup's frames); the whole of a
                           one-shard node's in `shard-0/` too

It is written as DIR.part and renamed to DIR only once every shard's
stream ended whole and every file is fsynced: a backup killed midway
leaves DIR.part, which restore refuses (no manifest), and never a DIR. A
second backup to an existing DIR (a backup: it has a manifest) replaces it
once whole; a directory that is not a backup is refused, nothing fetched.
It fetches only what changed: the files that only grow (delay logs, log
segments) DIR holds whole (their SHA-256 the manifest's) are named to each
shard (POST backupShard's `have`), and of each the node still holds, DIR's
bytes are copied here and the node sends what lies past them (hourly
files once full, the far spans' older messages, are not sent again).

A stopped node's data directory (`take_stopped`, `--data-dir`) is
copied file by file, each shard's store whole as it lies (a restore
opens it as the node's next start would), into the same layout; every
file is looked at (size, change time) before and after, and a copy
during which one changed -- the node is running -- is refused, nothing
kept: a node serving is backed up over its API.

`restore` checks every file against the manifest (size and SHA-256; a
damaged or missing file is refused, naming it), then writes a new data
directory (refused unless empty or absent) that a node opens as it was at
the backup's positions: its start replays each shard's log as after a
crash.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import stat
import struct
import time
from typing import Any, NamedTuple

import aiohttp
from yarl import URL

from storage import backup as frames
from storage.disk import DISK
from storage.errors import ConfigError, HourglassError
from storage.fileutil import FILE_MODE, fsync_dir, make_dir

from ..http.paths import PREFIX

log = logging.getLogger("hourglass.transfer")

MANIFEST = "manifest.json"
FORMAT = 1


class BackupFailed(HourglassError):
    """The node refused a backup, or its stream ended before its end frame."""


def shard_dir(index: int) -> str:
    return f"shard-{index}"


def take(url: str, token: str | None, out: str, timeout_s: float = 30.0,
         max_rate: float | None = None) -> dict[str, Any]:
    """A backup of the node at `url` into the directory `out` (module
    docstring), read at most `max_rate` bytes a second (None: as fast as
    it comes); what it did."""
    started = time.monotonic()
    part = _fresh_part(out)
    hashes: dict[str, Any] = {}
    earlier = _held(out)
    shards = asyncio.run(_streams(url, token, part, timeout_s, Pace(max_rate), hashes, earlier))
    return _finish(part, out, len(shards), [s["position"] for s in shards], _files(part, hashes), started,
                   {"received": sum(s["bytes"] for s in shards), "kept": sum(s.get("kept", 0) for s in shards),
                    "pausedSeconds": max(s["pausedSeconds"] for s in shards)}, online=True)


def _finish(part: str, out: str, count: int, positions: list[int | None], files: dict[str, dict[str, Any]],
            started: float, counts: dict[str, Any], online: bool) -> dict[str, Any]:
    """The manifest written last into `part`, everything fsynced, `part`
    renamed to `out` (an earlier backup there replaced); what was done.
    `online`: taken from a node (a later one may keep its files that only
    grow); else a stopped node's files as they lay (a mapped delay log's
    zeros too: nothing of it is kept)."""
    manifest = {"format": FORMAT, "shards": count, "taken": int(time.time() * 1000), "positions": positions,
                "online": online, "files": files}
    with open(os.open(os.path.join(part, MANIFEST), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "w",
              encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    DISK.fsync_tree(part)
    if os.path.exists(out):  # (checked before anything was fetched: `_replaceable`)
        old = out.rstrip("/") + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(out, old)
        os.rename(part, out)
        shutil.rmtree(old)
    else:
        os.rename(part, out)
    fsync_dir(os.path.dirname(os.path.abspath(out)))
    return {"to": out, "shards": count, "positions": positions, "files": len(files),
            "bytes": sum(f["size"] for f in files.values()), **counts, "seconds": round(time.monotonic() - started, 3)}


def take_stopped(data_dir: str, out: str) -> dict[str, Any]:
    """A backup of the stopped node whose data directory is `data_dir`
    into `out` (module docstring); what it did."""
    from ..disk.backups import STAGING_PREFIX
    from ..shards import layout

    started = time.monotonic()
    if not os.path.isdir(data_dir):
        raise ConfigError(f"--data-dir {data_dir} is not a directory")
    count = layout.kept(data_dir)
    if count is None:
        raise ConfigError(f"--data-dir {data_dir} holds no node's store (no checkpoint, no commit log)")
    stores = [layout.shard_path(data_dir, i, count) for i in range(count)]

    def files() -> dict[str, tuple[int, int]]:
        """Each regular file of the stores (relative to the backup) -> its size and change time."""
        found = {}
        for index, store in enumerate(stores):
            for folder, folders, names in os.walk(store):
                folders[:] = [f for f in folders if not f.startswith(STAGING_PREFIX)]
                for name in names:
                    path = os.path.join(folder, name)
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) and not name.startswith("snapshot") and not name.endswith(".tmp"):
                        found[os.path.join(shard_dir(index), os.path.relpath(path, store))] = (st.st_size,
                                                                                             st.st_mtime_ns)
        return found

    part = _fresh_part(out)
    before = files()
    for relative in sorted(before):
        index, _, inner = relative.partition(os.sep)
        target = os.path.join(part, relative)
        make_dir(os.path.dirname(target))
        source_fd = os.open(os.path.join(stores[int(index[len("shard-"):])], inner), os.O_RDONLY)
        try:
            target_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            try:
                frames.copy_range(source_fd, 0, os.fstat(source_fd).st_size, target_fd)
            finally:
                os.close(target_fd)
        finally:
            os.close(source_fd)
    if files() != before:
        shutil.rmtree(part)
        raise ConfigError(f"files of {data_dir} changed while they were copied: a node runs on it; back it up "
                          f"with --url (an online backup), nothing was kept")
    return _finish(part, out, count, [None] * count, _files(part, {}), started,
                   {"received": 0, "kept": 0, "pausedSeconds": 0.0}, online=False)


def _fresh_part(out: str) -> str:
    """DIR.part, empty (what a backup cut short left there deleted), once
    `out` is one a backup may replace."""
    _replaceable(out)
    part = os.path.abspath(out.rstrip("/") + ".part")
    if os.path.exists(part):
        shutil.rmtree(part)
    make_dir(part)
    return part


def _replaceable(out: str) -> None:
    """ConfigError unless `out` is absent, an empty directory, or a backup
    (it holds a manifest): a backup replaces nothing else."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise ConfigError(f"--to {out} is a file, not a backup's directory")
    if os.listdir(out) and not os.path.isfile(os.path.join(out, MANIFEST)):
        raise ConfigError(f"--to {out} holds files and no {MANIFEST}: not a backup, so not replaced; name a new "
                          f"directory")


class Held(NamedTuple):
    """A file that only grows (a delay log, a log segment) an earlier backup to the same place holds whole."""
    path: str  # absolute
    size: int
    digest: str  # storage.backup's tail_digest
    sha256: Any  # hashlib's, after its every byte (copied to go on hashing what the node appends)


def _held(out: str) -> dict[str, Held]:
    """The files that only grow of the backup at `out` (none: {}) whose bytes are the
    manifest's (size and SHA-256: a damaged one is fetched whole again),
    by their path relative to the backup."""
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"] if manifest.get("online") is True else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    held = {}
    for relative, want in files.items():
        inner = relative.partition(os.sep)[2]
        if not frames.appended_only(inner) or not isinstance(want, dict):
            continue
        path = os.path.join(out, relative)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            digest = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
            size = os.fstat(fd).st_size
            if size == want.get("size") and digest.hexdigest() == want.get("sha256") and size > 0:
                held[relative] = Held(path, size, frames.tail_digest(fd, size), digest)
        finally:
            os.close(fd)
    return held


class Pace:
    """At most `rate` bytes a second over the whole backup (None: no bound):
    a reader that pauses lets TCP slow the node's stream, so a backup of a
    busy node can take its CPU and disk in smaller bites."""

    def __init__(self, rate: float | None) -> None:
        if rate is not None and not rate > 0:
            raise ConfigError(f"--max-rate-mb must be above 0, got {rate / 1e6}")
        self.rate = rate
        self.started = time.monotonic()
        self.bytes = 0

    async def took(self, count: int) -> None:
        self.bytes += count
        if self.rate is not None:
            ahead = self.started + self.bytes / self.rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)


async def _streams(url: str, token: str | None, part: str, timeout_s: float, pace: Pace,
                   hashes: dict[str, Any], earlier: dict[str, Held]) -> list[dict[str, Any]]:
    """Every shard's stream written under `part`, one shard after another; their end frames."""
    base = URL(url.split(",")[0].strip().rstrip("/"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=max(timeout_s, 600))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(base / PREFIX.strip("/") / "getShardMap", headers=headers) as r:
            if r.status != 200:
                raise BackupFailed(f"{url} answered {r.status} to getShardMap: {(await r.text())[:300]}")
            shard_map = await r.json(content_type=None)
        ports = [int(p) for p in shard_map.get("ports") or [base.port]]
        return [await _shard(session, base.with_port(port), headers, index, part, pace, hashes, earlier)
                for index, port in enumerate(ports)]


async def _shard(session: aiohttp.ClientSession, base: URL, headers: dict[str, str], index: int,
                 part: str, pace: Pace, hashes: dict[str, Any], earlier: dict[str, Held]) -> dict[str, Any]:
    """Shard `index`'s stream written under `part`; its end frame. Each
    file's SHA-256 is taken as its bytes arrive, in order (`hashes`: path
    relative to `part` -> [the hash, bytes hashed]; a file whose frames
    came out of order is hashed again at the end). A `keep` frame: the
    first bytes of the file are `earlier`'s, copied here."""
    into = os.path.join(part, shard_dir(index))
    make_dir(into)
    top = part + os.sep  # (absolute: a file's key in `hashes` is its path after this)
    current: tuple[str, int] | None = None  # the one file open (a piece's frames come in a row)
    made: set[str] = set()
    mine = shard_dir(index) + os.sep
    have = {relative[len(mine):]: [h.size, h.digest] for relative, h in earlier.items() if relative.startswith(mine)}
    url = base / PREFIX.strip("/") / "backupShard"
    try:
        async with (session.post(url, headers=headers, json={"have": have}) if have
                    else session.get(url, headers=headers)) as r:
            if r.status == 404:
                raise BackupFailed(f"{base} serves no backups: a node on --backend redis:// keeps its messages in "
                                   f"Redis (docs/operations.md, \"Backup and restore\")")
            if r.status != 200:
                raise BackupFailed(f"{base} answered {r.status} to backupShard: {(await r.text())[:300]}")
            while True:
                try:
                    head = await r.content.readexactly(frames.FRAME.size)
                    header_length, data_length = frames.FRAME.unpack(head)
                    header = json.loads(await r.content.readexactly(header_length))
                    data = await r.content.readexactly(data_length) if data_length else b""
                except (aiohttp.ClientPayloadError, EOFError, struct.error) as e:  # IncompleteReadError is an EOFError
                    raise BackupFailed(f"shard {index}'s backup stream ended before its end: {e!r}") from None
                if "error" in header:
                    raise BackupFailed(f"shard {index}: {header['error']}")
                if header.get("end"):
                    return dict(header)
                path = _inside(into, header["path"])
                if "keep" in header:
                    if current is not None:
                        os.close(current[1])
                        current = None
                    _keep(earlier.get(path[len(top):]), int(header["keep"]), path, hashes, top)
                    made.add(path)
                    continue
                if current is None or current[0] != path:
                    if current is not None:
                        os.close(current[1])
                        current = None
                    if path not in made:
                        make_dir(os.path.dirname(path))
                    flags = os.O_WRONLY | os.O_CREAT | (0 if path in made else os.O_TRUNC)
                    current = (path, os.open(path, flags, FILE_MODE))
                    made.add(path)
                fd = current[1]
                at = int(header["at"])
                os.pwrite(fd, data, at)
                running = hashes.setdefault(path[len(top):], [hashlib.sha256(), 0])
                if running[0] is not None and running[1] == at:
                    running[0].update(data)
                    running[1] += len(data)
                else:
                    running[0] = None  # (out of order: hashed from the file)
                await pace.took(len(data))
    finally:
        if current is not None:
            os.close(current[1])


def _keep(held: Held | None, size: int, path: str, hashes: dict[str, Any], top: str) -> None:
    """`path` made of the earlier backup's copy of it (`held`), `size`
    bytes: all of it, as the node said it holds."""
    if held is None or held.size != size:
        raise BackupFailed(f"the node kept {size} bytes of {path[len(top):]!r}, which the earlier backup does not "
                           f"hold")
    make_dir(os.path.dirname(path))
    source = os.open(held.path, os.O_RDONLY)
    try:
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            frames.copy_range(source, 0, size, target)
        finally:
            os.close(target)
    finally:
        os.close(source)
    hashes[path[len(top):]] = [held.sha256.copy(), size]


def _inside(root: str, relative: str) -> str:
    """`relative` under `root`, refusing a path that would leave it."""
    top = os.path.abspath(root)
    path = os.path.abspath(os.path.join(top, relative))
    if os.path.isabs(relative) or not path.startswith(top + os.sep):
        raise BackupFailed(f"the node sent a file outside the backup: {relative!r}")
    return path


def _files(root: str, hashes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file under `root`: relative path -> size and SHA-256 (the one
    taken as it arrived, when it covers the whole file)."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(folder, name)
            relative, size = os.path.relpath(path, root), os.path.getsize(path)
            running = hashes.get(relative)
            digest = running[0].hexdigest() if running and running[0] is not None and running[1] == size \
                else _sha256(path)
            found[relative] = {"size": size, "sha256": digest}
    return found


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check(source: str) -> dict[str, Any]:
    """The backup's manifest, once every file it names is there with its
    size and SHA-256; ConfigError naming the first that is not."""
    path = os.path.join(source, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{source} is no whole backup: it has no {MANIFEST} (a backup cut short leaves "
                          f"DIR.part, never DIR)") from None
    except ValueError as e:
        raise ConfigError(f"{path} is damaged: {e}") from None
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{path} is of backup format {manifest.get('format')!r}; this hourglass reads {FORMAT}")
    for relative, want in sorted(manifest["files"].items()):
        file_path = os.path.join(source, relative)
        if not os.path.isfile(file_path):
            raise ConfigError(f"{file_path} is missing from the backup; nothing was restored")
        if os.path.getsize(file_path) != want["size"] or _sha256(file_path) != want["sha256"]:
            raise ConfigError(f"{file_path} is damaged (its size or SHA-256 is not the manifest's); nothing was "
                              f"restored")
    return manifest


def restore(source: str, data_dir: str) -> dict[str, Any]:
    """A new data directory from the backup at `source` (module docstring)."""
    started = time.monotonic()
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)):
        raise ConfigError(f"--data-dir {data_dir} is not empty: restore writes a new data directory; name an "
                          f"empty or absent one")
    manifest = check(source)
    count = int(manifest["shards"])
    part = data_dir.rstrip("/") + ".restoring"
    shutil.rmtree(part, ignore_errors=True)
    make_dir(part)
    for index in range(count):
        target = part if count == 1 else os.path.join(part, shard_dir(index))
        shutil.copytree(os.path.join(source, shard_dir(index)), target, dirs_exist_ok=True,
                        copy_function=shutil.copyfile)
    if count > 1:
        with open(os.path.join(part, "shards"), "w", encoding="ascii") as f:
            f.write(f"{count}\n")
    for folder, _, names in os.walk(part):
        os.chmod(folder, 0o700)
        for name in names:
            os.chmod(os.path.join(folder, name), FILE_MODE)
    DISK.fsync_tree(part)
    if os.path.exists(data_dir):
        os.rmdir(data_dir)
    os.rename(part, data_dir)
    fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
    return {"dataDir": data_dir, "shards": count, "positions": manifest["positions"],
            "files": len(manifest["files"]), "seconds": round(time.monotonic() - started, 3)}
