"""A data directory's shards: how many, and where each one's store is
(docs/configuration.md, "--shards").

The count is kept in the data directory (`DATA/shards`, one line) the
first time a node opens it, and every later start keeps it: placement
hashes over it, so a directory's messages are where its count put them.

    a new directory     --shards N, or `auto` (the default): the cores this
                        process may run on
    kept count K        --shards auto opens K; --shards N != K is refused
    an older directory  (a store's own files, STORE_ENTRIES, no count) one
                        shard, as before; no count written into it (its
                        store, one shard, is the directory itself, so it
                        says 1 at every start), so a directory whose files
                        are refused (a newer or a retired format) is left
                        as it was; a directory holding other files only
                        (a log) is new
    refused             the count and the `shard-<i>` directories
                        disagree, or the count is missing beside them (a
                        restore that missed one file): a sentence naming
                        both, nothing opened or written

One shard's store is the data directory itself, as a node of one process
has always kept it; shard i of N > 1 keeps its own in `DATA/shard-<i>/`.
"""

from __future__ import annotations

import os

from storage.errors import ConfigError
from storage.fileutil import make_dir

COUNT_FILE = "shards"
# What a store of one shard keeps in its directory (storage/): an older
# release's directory is judged by these, not by whatever else it holds.
STORE_ENTRIES = ("commitlog", "checkpoint")
SHARD_PREFIX = "shard-"
AUTO = "auto"
# The most shards a node runs: one process each, each with its files and sockets.
MAX_SHARDS = 64


def cores() -> int:
    """The cores this process may run on (its affinity, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parse(asked: str) -> int | None:
    """--shards: a count, or None for `auto`; ConfigError naming the flag."""
    if asked == AUTO:
        return None
    try:
        count = int(asked)
    except ValueError:
        raise ConfigError(f"--shards must be a number of shards or auto, got {asked!r}") from None
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"--shards must be 1 to {MAX_SHARDS} (or auto), got {count}")
    return count


def kept(data_path: str) -> int | None:
    """The count the data directory keeps; 1 for a store an older release
    made (its own files, no count); None for a new directory. ConfigError,
    in a sentence naming the file and the directories: a count that the
    `shard-<i>` directories contradict, or none beside them."""
    path = os.path.join(data_path, COUNT_FILE)
    shards = shard_directories(data_path)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        if shards:
            raise ConfigError(f"{path} is missing, but the data directory holds {_listed(shards)}: a node of "
                              f"{len(shards)} or more shards keeps its count there (a copy or restore that "
                              f"missed one file?). Put the file back (one line: the count), or start on a new "
                              f"--data-dir; nothing was opened or written") from None
        if any(os.path.lexists(os.path.join(data_path, name)) for name in STORE_ENTRIES):
            return 1
        return None
    if not (0 < len(text) <= 2 and text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_SHARDS:
        raise ConfigError(f"{path} holds {text[:20]!r}, not a shard count of 1 to {MAX_SHARDS}")
    count = int(text)
    expected = [] if count == 1 else [f"{SHARD_PREFIX}{i}" for i in range(count)]
    if shards != expected:
        raise ConfigError(f"{path} keeps {count} shard{'s' if count > 1 else ''}, but the data directory holds "
                          f"{_listed(shards) if shards else 'no shard-<i> directory'}"
                          f"{'' if count == 1 else f' (it needs {_listed(expected)})'}: a copy or restore that "
                          f"missed or mixed files? Put them back as they were, or start on a new --data-dir; "
                          f"nothing was opened or written")
    return count


def shard_directories(data_path: str) -> list[str]:
    """The `shard-<i>` directories in the data directory, by index."""
    try:
        names = os.listdir(data_path)
    except FileNotFoundError:
        return []
    found = [name for name in names if name.startswith(SHARD_PREFIX) and name[len(SHARD_PREFIX):].isascii()
             and name[len(SHARD_PREFIX):].isdigit() and len(name) <= len(SHARD_PREFIX) + 3]
    return sorted(found, key=lambda name: int(name[len(SHARD_PREFIX):]))


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"{name}/" for name in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def resolve(data_path: str, asked: str) -> int:
    """The count a node opens `data_path` with (see the module docstring),
    written into it when it is new. ConfigError: a count that conflicts
    with the kept one, in a sentence."""
    want = parse(asked)
    have = kept(data_path)
    if have is not None:
        if want is not None and want != have:
            raise ConfigError(f"the data directory {data_path} keeps {have} shard{'s' if have > 1 else ''} and "
                              f"--shards {want} was given: its messages are placed over {have}; start with "
                              f"--shards {have} (or auto), or use a new --data-dir")
        return have  # kept in the file, or an older directory's: nothing written
    count = cores() if want is None else want
    write(data_path, count)
    return count


def write(data_path: str, count: int) -> None:
    """Keep `count` in the data directory, durably (written, synced,
    renamed), its `shard-<i>` directories made first: once the count is
    there, so is every shard's directory (`kept` checks they agree)."""
    make_dir(data_path)
    if count > 1:
        for index in range(count):
            make_dir(shard_path(data_path, index, count))
    path = os.path.join(data_path, COUNT_FILE)
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{count}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(data_path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def shard_path(data_path: str, index: int, count: int) -> str:
    """Where shard `index` of `count` keeps its store."""
    return data_path if count == 1 else os.path.join(data_path, f"shard-{index}")


def links_path(data_path: str) -> str:
    """The directory of the shards' local sockets (private, as the data directory)."""
    return os.path.join(data_path, "links")
