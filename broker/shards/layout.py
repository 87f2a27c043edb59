"""A data directory's shards: how many, and where each one's store is
(docs/configuration.md, "--shards").

The count is kept in the data directory (`DATA/shards`, one line) the
first time a node opens it, and every later start keeps it: placement
hashes over it, so a directory's messages are where its count put them.

    a new directory     --shards N, or `auto` (the default): the cores this
                        process may run on
    kept count K        --shards auto opens K; --shards N != K is refused
    an older directory  (a store, no count) one shard, as before; no count
                        written into it (its store, one shard, is the
                        directory itself, so it says 1 at every start),
                        so a directory whose files are refused (a newer
                        or a retired format) is left as it was

One shard's store is the data directory itself, as a node of one process
has always kept it; shard i of N > 1 keeps its own in `DATA/shard-<i>/`.
"""

from __future__ import annotations

import os

from storage.errors import ConfigError
from storage.fileutil import make_dir

COUNT_FILE = "shards"
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
    made (no count, but files); None for a new, empty directory."""
    try:
        with open(os.path.join(data_path, COUNT_FILE), encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 1 if os.path.isdir(data_path) and os.listdir(data_path) else None
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"{os.path.join(data_path, COUNT_FILE)} holds {text!r}, not a shard count") from None
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"{os.path.join(data_path, COUNT_FILE)} holds {count}, not 1 to {MAX_SHARDS}")
    return count


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
    """Keep `count` in the data directory, durably (written, synced, renamed)."""
    make_dir(data_path)
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
