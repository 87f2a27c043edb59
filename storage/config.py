"""Settings of the storage engine: one frozen dataclass, built by the CLI."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import ConfigError


class FsyncPolicy(enum.Enum):
    """When appended records reach the disk.

    ALWAYS: every append is fsync'ed before it returns (still applied, and
            visible, only at `Store.commit()`).
    BATCH:  appends are fsync'ed together by `Store.commit()` (group commit);
            nothing is visible or acknowledged before that.
    NEVER:  the operating system writes when it likes. A killed process loses
            nothing (the page cache survives it); a machine crash may lose the
            last seconds.
    """

    ALWAYS = "always"
    BATCH = "batch"
    NEVER = "never"


@dataclass(frozen=True)
class StoreConfig:
    # When commit-log appends are fsync'ed; see FsyncPolicy.
    fsync: FsyncPolicy = FsyncPolicy.BATCH
    # Size a commit-log segment is preallocated to; a record never spans two
    # segments, so a record larger than this gets a segment of its own size.
    segment_bytes: int = 64 * 1024 * 1024
    # How long an hour whose messages have all ended is kept (so getMsg can
    # still read them) before its files are deleted.
    retention_ms: int = 3 * 24 * 3600 * 1000
    # Slots each id-index shard starts with (a power of two); shards double
    # independently when 70% full.
    id_shard_initial_slots: int = 1024
    # The store's id, key and end indexes together larger than this keep
    # their mapped pages out of the process's RSS as they work
    # (storage.id_index, Residency); smaller, they stay resident.
    # `--index-resident-mb`.
    index_resident_bytes: int = 8 << 20
    # Far (not memory-mapped) hours whose files may be open at once (three
    # descriptors each; lowered to fit the process's file limit).
    open_far_hours: int = 2048

    def __post_init__(self) -> None:
        if not isinstance(self.fsync, FsyncPolicy):
            raise ConfigError(f"fsync must be a FsyncPolicy, got {self.fsync!r}")
        if self.segment_bytes < 4096:
            raise ConfigError(f"segment_bytes must be at least 4096, got {self.segment_bytes}")
        if self.retention_ms < 0:
            raise ConfigError(f"retention_ms must be >= 0, got {self.retention_ms}")
        slots = self.id_shard_initial_slots
        if slots < 16 or slots & (slots - 1):
            raise ConfigError(f"id_shard_initial_slots must be a power of two >= 16, got {slots}")
        if self.index_resident_bytes < 0:
            raise ConfigError(f"index_resident_bytes (--index-resident-mb) must be >= 0, got {self.index_resident_bytes}")
        if self.open_far_hours < 4:
            raise ConfigError(f"open_far_hours must be at least 4, got {self.open_far_hours}")
