"""The topic settings file (broker.flow.file) and its entries
(broker.flow.settings): any settings round-trip through the file and
through a reopened copy of the same directory; a torn file (cut anywhere)
and a file with any byte flipped are refused loudly with CorruptionError
naming the path, never read as other settings."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from corruption import xor_byte
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.flow.file import HEADER, SettingsFile, decode, encode
from broker.flow.settings import OnResume, Pause, TopicSettings, entries, rows
from storage.errors import CorruptionError

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20)
pauses = st.builds(Pause, st.integers(0, 2**50), st.sampled_from(list(OnResume)),
                   st.one_of(st.none(), st.integers(0, 2**50)))
topics = st.builds(TopicSettings, names, st.integers(0, 10**6), st.sampled_from(["none", "fairKey"]),
                   st.integers(0, 10**9), st.integers(0, 10**9), st.one_of(st.none(), pauses),
                   st.dictionaries(names, pauses, max_size=5))
all_settings = st.lists(topics, max_size=6, unique_by=lambda s: s.topic).map(
    lambda found: {s.topic: s for s in found if not s.is_default})


@settings(max_examples=200, deadline=None)
@given(all_settings)
def test_settings_round_trip_through_the_file_and_a_reopened_copy(kept):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        asyncio.run(SettingsFile(path).save(kept))
        assert SettingsFile(path).load() == kept
        assert rows(entries(kept.values())) == kept
        assert not os.path.exists(path + ".tmp")


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
def test_a_flipped_byte_is_refused(kept, data):
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "topic-settings")
        asyncio.run(SettingsFile(path).save(kept))
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
