"""Opening a data directory: derived files repaired from the commit log.

The commit log is the truth; the checkpoint says up to which offset the
derived files (hour files, id index) were durable, and how large each
hour was then. Opening therefore:

    1. loads the checkpoint (none: an empty store) and opens the commit
       log, which cuts a torn tail; refuses a checkpoint offset outside
       the log, and a directory from before spans holding a hour whose
       number now names a span
    2. deletes hour files the checkpoint does not list (made after it, or
       retired): replay makes them again
    3. opens the id index, or rebuilds it (missing, or from before its
       keyed hash) from every entry of the checkpointed hours
    4. replays every record after the checkpoint's offset, exactly as
       `commit()` applies it (applying twice changes nothing), and writes
       everything staged
    5. cuts each hour's files to exactly its data (a crash can leave
       preallocation or a half-applied tail)

A record its checksum passed that does not decode or apply raises
CorruptionError naming the log and the offset: the directory is refused,
never half-opened (`Store.open` then closes every file it opened).

Recovery is a step, not a part: it owns no state once the store is open.
`Store.open` calls its functions in the order above, and each works on
what the one before made: `open_log` gives the checkpoint and the log,
`load_hours` fills the `HourTable` built from them, `open_id_index` opens
the index over that table, and `replay` runs on the store's built parts
(the `Applier` applies, the `Reader` scans), exactly as they run later.
"""

from __future__ import annotations

import os

from . import delay_index, delay_log, second_table, spans
from .applying import Applier
from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .delay_index import FLAG_RELEASED
from .disk import Disk
from .entry import Status
from .errors import CorruptionError
from .fileutil import make_dir, refuse_newer_file
from .hour import Hour
from .hour_files import hour_paths, parse_hour_name
from .hour_table import HourTable
from .id_index import IdIndex, Residency
from .reading import Reader


def open_log(directory: str, config: StoreConfig, disk: Disk) -> tuple[Checkpoint, CommitLog]:
    """Step 1: the checkpoint (none: an empty store's) and the commit log
    (on `disk`), its torn tail cut; refuses a checkpoint the log or this
    layout cannot follow (and then closes the log)."""
    make_dir(directory)  # not made with delay/ below: a parent gets no DIR_MODE
    make_dir(os.path.join(directory, "delay"))
    checkpoint_path = os.path.join(directory, "checkpoint")
    ck = Checkpoint.load(checkpoint_path) or Checkpoint()
    log = CommitLog.open(os.path.join(directory, "commitlog"), config.fsync, config.segment_bytes,
                         scan_from=ck.commit_offset, disk=disk)
    try:
        if log.start_offset > ck.commit_offset or log.end_offset < ck.commit_offset:
            raise CorruptionError(checkpoint_path, 0,
                                  f"checkpoint offset {ck.commit_offset} is outside the commit log "
                                  f"[{log.start_offset}, {log.end_offset}]")
        if ck.layout < spans.LAYOUT and any(spans.is_span(h.hour) for h in ck.hours):
            hour = max(h.hour for h in ck.hours)
            raise CorruptionError(checkpoint_path, 0,
                                  f"this data directory was written before far hours were filed in spans, and "
                                  f"holds hour {hour} (after the year 2926), whose number now names a span; "
                                  f"to migrate, delete its messages due after 2926 with the release that wrote "
                                  f"it, then open it here")
    except BaseException:
        log.close()
        raise
    return ck, log


def load_hours(hours: HourTable, ck: Checkpoint) -> None:
    """Step 2: the checkpoint's hours into the table; files of hours it does
    not list were created after it (replay recreates them) or belong to a
    retired hour, and are deleted."""
    for h in ck.hours:
        hours.add(Hour(h.hour, h.entries, h.log_bytes, h.ended, h.last_end_ms, h.topics))
    for name in os.listdir(hours.delay_dir):
        hour = parse_hour_name(name)
        if hour is None or hour not in hours:
            os.unlink(os.path.join(hours.delay_dir, name))


def open_id_index(directory: str, config: StoreConfig, hours: HourTable, disk: Disk,
                  residency: Residency) -> IdIndex:
    """Step 3: the id index in `directory` (on `disk`), or a new one (new secret) holding
    every unreleased message of the checkpointed hours when it is missing
    or from before the keyed hash: every entry and the front of every body
    read once; replaying the log adds the rest."""
    if IdIndex.is_current(directory):
        return IdIndex.open(directory, config.id_shard_initial_slots, hours.__contains__, hours.released, disk,
                            residency)
    ids = IdIndex.build(directory, config.id_shard_initial_slots, hours.__contains__, hours.released, disk,
                        residency)
    try:
        for h in hours.ascending():
            files = hours.files(h)
            for gi in range(h.entries):
                _, offset8, size, flags = files.read_entry(gi)
                if not flags & FLAG_RELEASED:
                    topic, msg_id = delay_log.id_fields(files.read_body(offset8, size))
                    ids.put(ids.key_of_bytes(topic, msg_id), h.hour, gi)
        ids.publish()
    except BaseException:
        ids.close()
        raise
    return ids


def replay(ck: Checkpoint, log: CommitLog, hours: HourTable, applier: Applier, reader: Reader) -> None:
    """Steps 4 and 5: every record after the checkpoint applied as `commit()`
    applies it, everything staged written, each hour's files cut to its
    data; and, after a checkpoint from before the in-flight set was kept,
    the hours holding CONSUMING messages scanned for it once."""
    for offset, body in log.read_from(ck.commit_offset):
        try:
            kind, now_ms, items = applier.decode(body)
            applier.apply(kind, now_ms, items, None)
            applier.apply_deferred(None)  # a COMMIT's parts, at once
        except (LookupError, ValueError) as e:  # a body its checksum passed but no record: refuse
            raise CorruptionError(log.directory, offset, f"commit-log record at offset {offset}: {e}") from e
    hours.flush_staged(everything=True)
    _trim_hour_files(hours)
    if ck.consuming is None:
        for h in hours.ascending():
            if any(counts[Status.CONSUMING] for counts in h.topics.values()):
                for entry in reader.hour_entries(h.hour):
                    if entry.status == Status.CONSUMING:
                        applier.found_consuming(entry.location)


def _trim_hour_files(hours: HourTable) -> None:
    """Cut each hour's log and index to exactly its data (a crash can leave
    a mapped file's preallocation or half-applied tail behind)."""
    for h in hours.ascending():
        log_path, idx_path, sec_path = hour_paths(hours.delay_dir, h.hour)
        if not os.path.exists(sec_path):
            raise CorruptionError(sec_path, 0, f"hour {h.hour} is in the checkpoint but its files are missing")
        for path, module in ((log_path, delay_log), (idx_path, delay_index), (sec_path, second_table)):
            refuse_newer_file(path, module.MAGIC, module.VERSION)  # before any file is cut
        log_size = delay_log.HEADER_BYTES + h.log_bytes
        idx_size = delay_index.entry_offset(h.entries)
        for path, size in ((log_path, log_size), (idx_path, idx_size)):
            actual = os.path.getsize(path)
            if actual < size:
                raise CorruptionError(path, actual, f"file is {actual} bytes, its data needs {size}")
            if actual > size and h.files is None:  # an open hour is cut when it closes
                os.truncate(path, size)
