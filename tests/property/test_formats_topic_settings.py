"""The topic settings files (broker.flow.file) and their entries
(broker.flow.settings): any sequence of changes, each appended to the log
(and now and then folded into a new base), reads back from a reopened copy
of the directory as the model of those changes; the log cut at any byte (a
crash mid-append) reads as the changes whose records are whole, and the
next change appends after them; a crash between a new base and the log's
emptying reads the same; a torn base file (cut anywhere) and a base with
any byte flipped, or a log record before the last with any byte flipped,
are refused loudly with CorruptionError naming the path, never read as
other settings."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from corruption import xor_byte
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.flow import file as settings_file
from broker.flow.file import HEADER, LOG_HEADER, RECORD, SettingsFile, ShardSettings, decode, encode
from broker.flow.settings import OnResume, Pause, TopicConfig, TopicSettings, entries, entry_changes, rows
from storage.errors import CorruptionError

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20)
pauses = st.builds(Pause, st.integers(0, 2**50), st.sampled_from(list(OnResume)),
                   st.one_of(st.none(), st.integers(0, 2**50)))
topics = st.builds(TopicSettings, names, st.integers(0, 10**6), st.sampled_from(["none", "fairKey"]),
                   st.integers(0, 10**9), st.integers(0, 10**9), st.one_of(st.none(), pauses),
                   st.dictionaries(names, pauses, max_size=5))
all_settings = st.lists(topics, max_size=6, unique_by=lambda s: s.topic).map(
    lambda found: {s.topic: s for s in found if not s.is_default})


def write_base(path: str, kept: dict[str, TopicSettings]) -> None:
    with open(path, "wb") as f:
        f.write(encode(entries(kept.values())))


@settings(max_examples=200, deadline=None)
@given(all_settings)
def test_settings_round_trip_through_the_base_file_and_a_reopened_copy(kept):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        write_base(path, kept)
        assert SettingsFile(path).load() == kept
        assert rows(entries(kept.values())) == kept


# A change: (topic, key or None, a pause or None, a release rate for a config change or None)
changes = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"])),
                             st.one_of(st.none(), pauses), st.one_of(st.none(), st.integers(0, 1000))),
                   min_size=1, max_size=25)


def apply(model: dict[str, TopicSettings], change) -> tuple[TopicSettings, str | None]:
    """The model after one change (as broker.flow.keeper makes them), and the key changed."""
    topic, key, pause, rate = change
    current = model.get(topic) or TopicSettings(topic)
    if rate is not None:
        new = current.with_config(TopicConfig(topic, rate, current.fairness, current.max_due_age_ms,
                                              current.dedup_window_ms))
        key = None
    else:
        new = current.with_pause(key, pause)
    if new.is_default:
        model.pop(topic, None)
    else:
        model[topic] = new
    return new, key


def run_changes(path: str, steps) -> list[dict[str, TopicSettings]]:
    """Each change saved through one SettingsFile; the model after each (the first: before any)."""
    store = SettingsFile(path)
    model = dict(store.load())
    states = [dict(model)]
    try:
        for change in steps:
            new, key = apply(model, change)
            asyncio.run(store.save(dict(model), entry_changes(new, key)))
            states.append(dict(model))
    finally:
        store.close()
    return states


@settings(max_examples=150, deadline=None)
@given(changes, st.sampled_from([0, 300, 1 << 20]))
def test_changes_read_back_as_their_model_through_the_log_and_its_compactions(steps, compact_at):
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings_file, "COMPACT_MIN_BYTES", compact_at)
        path = os.path.join(root, "topic-settings")
        states = run_changes(path, steps)
        assert SettingsFile(path).load() == states[-1]
        assert not os.path.exists(path + ".tmp")
        if compact_at == 1 << 20:  # (no compaction: a change appends its record, no more)
            assert not os.path.exists(path)


def record_ends(log: bytes) -> list[int]:
    """Where each whole record of a log ends."""
    at, ends = LOG_HEADER.size, []
    while at < len(log):
        length, _ = RECORD.unpack_from(log, at)
        at += RECORD.size + length
        ends.append(at)
    return ends


@settings(max_examples=150, deadline=None)
@given(changes, st.data())
def test_a_log_cut_at_any_byte_reads_as_its_whole_records_and_the_next_change_follows(steps, data):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        states = run_changes(path, steps)
        with open(path + ".log", "rb") as f:
            log = f.read()
        cut = data.draw(st.integers(LOG_HEADER.size, len(log)))
        os.truncate(path + ".log", cut)
        whole = sum(1 for end in record_ends(log) if end <= cut)
        assert SettingsFile(path).load() == states[whole]
        assert os.path.getsize(path + ".log") == [LOG_HEADER.size, *record_ends(log)][whole]  # the torn tail cut
        more = data.draw(changes)
        model = dict(states[whole])
        after = run_changes(path, more)  # (reads what is kept, then appends)
        assert after[0] == model
        assert SettingsFile(path).load() == after[-1]


@settings(max_examples=150, deadline=None)
@given(changes, st.sampled_from([0, 300, 1 << 20]), st.data())
def test_another_shard_reads_the_keepers_files_as_the_keeper_does_and_changes_nothing(steps, compact_at, data):
    """Shard i > 0 of a node reads shard 0's files (broker.flow.file's
    ShardSettings): the same settings as shard 0 would, a torn last record
    left out and left in place (its writer's to cut)."""
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings_file, "COMPACT_MIN_BYTES", compact_at)
        path = os.path.join(root, "topic-settings")
        states = run_changes(path, steps)
        assert ShardSettings(path, path + "-resumes").load() == states[-1]
        if not os.path.exists(path + ".log"):
            return
        with open(path + ".log", "rb") as f:
            log = f.read()
        cut = data.draw(st.integers(LOG_HEADER.size, len(log)))
        os.truncate(path + ".log", cut)
        whole = sum(1 for end in record_ends(log) if end <= cut)
        before = files_in(root)
        read = ShardSettings(path, path + "-resumes").load()
        assert files_in(root) == before
        assert read == SettingsFile(path).load()  # (the keeper's read, which cuts the torn tail)
        if compact_at == 1 << 20:  # no compaction: the log holds every change
            assert read == states[whole]


def files_in(root: str) -> dict[str, bytes]:
    found = {}
    for name in os.listdir(root):
        with open(os.path.join(root, name), "rb") as f:
            found[name] = f.read()
    return found


def test_a_compaction_waits_for_a_shard_reading_the_files(tmp_path):
    """A compaction writes the new base and empties the log under an
    exclusive flock of the log; a shard reading holds it shared, so it
    never reads the old base and then the emptied log."""
    import fcntl
    import threading

    path = str(tmp_path / "topic-settings")
    store = SettingsFile(path)
    store.load()
    kept = {"a": TopicSettings("a", release_rate=5)}
    asyncio.run(store.save(kept, entry_changes(kept["a"], None)))
    with open(path + ".log", "rb") as reader:
        fcntl.flock(reader.fileno(), fcntl.LOCK_SH)  # a shard's read in progress
        done = threading.Event()
        compacting = threading.Thread(target=lambda: (store._compact(lambda: entries(kept.values())), done.set()))
        compacting.start()
        assert not done.wait(0.3)  # held until the read ends
        assert not os.path.exists(path)
        fcntl.flock(reader.fileno(), fcntl.LOCK_UN)
        assert done.wait(10)
        compacting.join()
    store.close()
    assert ShardSettings(path, path + "-resumes").load() == kept


@settings(max_examples=100, deadline=None)
@given(changes.filter(lambda steps: len(steps) >= 2))
def test_a_crash_between_a_new_base_and_the_logs_emptying_reads_the_same(steps):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        states = run_changes(path, steps)
        write_base(path, states[-1])  # the new base written, the log not yet emptied
        assert SettingsFile(path).load() == states[-1]


@settings(max_examples=100, deadline=None)
@given(changes.filter(lambda steps: len(steps) >= 2), st.data())
def test_a_flipped_byte_in_the_logs_header_or_a_record_before_the_last_is_refused(steps, data):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        run_changes(path, steps)
        log_path = path + ".log"
        with open(log_path, "rb") as f:
            log = f.read()
        ends = record_ends(log)
        # a body byte of a record before the last, or a header byte of the file
        position = data.draw(st.one_of(st.integers(0, 5), st.integers(LOG_HEADER.size + RECORD.size, ends[-2] - 1)
                                       .filter(lambda at: not any(end <= at < end + RECORD.size for end in ends))))
        xor_byte(log_path, position, data.draw(st.integers(1, 255)))
        with pytest.raises(CorruptionError) as refused:
            SettingsFile(path).load()
        assert refused.value.path == log_path, refused.value


@settings(max_examples=200, deadline=None)
@given(all_settings.filter(bool), st.data())
def test_a_torn_file_is_refused(kept, data):
    raw = encode(entries(kept.values()))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptionError) as refused:
        decode("/d/topic-settings", raw[:cut])
    assert refused.value.path == "/d/topic-settings" and refused.value.offset in (0, 8), refused.value


@settings(max_examples=200, deadline=None)
@given(all_settings.filter(bool), st.data())
def test_a_flipped_byte_in_the_base_is_refused(kept, data):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        write_base(path, kept)
        size = os.path.getsize(path)
        position = data.draw(st.integers(0, size - 1))
        xor_byte(path, position, data.draw(st.integers(1, 255)))
        with pytest.raises(CorruptionError) as refused:
            SettingsFile(path).load()
        assert refused.value.path == path and 0 <= refused.value.offset <= HEADER.size, refused.value


def test_no_file_is_no_settings(tmp_path):
    assert SettingsFile(str(tmp_path / "topic-settings")).load() == {}


def test_an_entry_no_node_wrote_is_refused(tmp_path):
    path = tmp_path / "topic-settings"
    path.write_bytes(encode({'["x","t"]': b"{}"}))
    with pytest.raises(CorruptionError) as refused:
        SettingsFile(str(path)).load()
    assert refused.value.offset == HEADER.size and "unknown kind" in refused.value.reason


@settings(max_examples=50, deadline=None)
@given(changes, st.integers(1, 64))
def test_a_log_with_zeros_after_its_records_reads_as_its_records(steps, zeros):
    """A crash may leave a file's new length with its bytes unwritten (zeros)."""
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        states = run_changes(path, steps)
        size = os.path.getsize(path + ".log")
        with open(path + ".log", "ab") as f:
            f.write(b"\0" * zeros)
        assert SettingsFile(path).load() == states[-1]
        assert os.path.getsize(path + ".log") == size


def test_a_resume_in_progress_on_a_shard_is_kept_there_until_it_ends(tmp_path):
    """Shard i > 0 saves nothing of a pause (shard 0 does), but a resume in
    progress (`shift`, `expire`: its resume time kept) is saved in its own
    files until it ends: killed in the middle while shard 0 finished, it
    reads the topic still paused with that time, so the next resumeTopic
    ends its part; once ended, shard 0's settings are read again."""
    keeper = SettingsFile(str(tmp_path / "keeper"))
    keeper.load()
    own_path = str(tmp_path / "topic-resumes")
    paused = TopicSettings("t", pause=Pause(1_000, OnResume.SHIFT))
    resuming = TopicSettings("t", pause=Pause(1_000, OnResume.SHIFT, 5_000))
    done = TopicSettings("t")
    shard = ShardSettings(keeper.path, own_path)
    assert shard.load() == {}
    for s in (paused, resuming):
        asyncio.run(keeper.save({"t": s}, entry_changes(s)))
        asyncio.run(shard.save({"t": s}, entry_changes(s)))
    assert os.path.exists(own_path + ".log")  # the resume in progress, kept on this shard
    assert ShardSettings(keeper.path, own_path).load() == {"t": resuming}
    asyncio.run(keeper.save({}, entry_changes(done)))  # shard 0 ended its part; this shard is killed
    assert ShardSettings(keeper.path, own_path).load() == {"t": resuming}  # still resuming here
    shard = ShardSettings(keeper.path, own_path)
    shard.load()
    asyncio.run(shard.save({}, entry_changes(done)))  # the next resumeTopic ended it here
    assert ShardSettings(keeper.path, own_path).load() == {}
    key_paused = TopicSettings("t", keys={"k": Pause(2_000, OnResume.HOLD)})
    asyncio.run(keeper.save({"t": key_paused}, entry_changes(key_paused, "k")))
    asyncio.run(shard.save({"t": key_paused}, entry_changes(key_paused, "k")))  # a pause: nothing saved here
    assert ShardSettings(keeper.path, own_path).load() == {"t": key_paused}
    keeper.close()
    shard.close()
