"""A message whose text holds a valid-looking frame cannot turn a torn last
record into a store that refuses to open: a commit-log record's checksum
covers its offset and its segment's salt (storage.framing), which the
sender's copy cannot match."""

from __future__ import annotations

import os
import zlib

from storage.commit_log import HEADER_BYTES
from storage.entry import MS_PER_HOUR
from storage.framing import FRAME_HEADER, encode_frame
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


def text_frame() -> str:
    """A frame (length, crc32 of the body, body) whose every byte is ASCII
    or NUL, so it can travel inside a JSON or form `msg` as it is."""
    for n in range(10_000):
        body = f"forged record {n:05d} " * 3
        frame = encode_frame(body.encode())
        if all(b < 0x80 for b in frame):
            assert FRAME_HEADER.unpack_from(frame)[1] == zlib.crc32(body.encode())
            return frame.decode()
    raise AssertionError("no ASCII frame found")


def test_a_torn_send_whose_message_embeds_a_frame_is_dropped_not_refused(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)
    store.send([NewMessage("t", "kept", "body", NOW, NOW + 1000, 60_000, 3)], NOW)
    store.commit()
    torn_at = store.log_end_offset
    inner = text_frame()
    store.send([NewMessage("t", "torn", "before " + inner + " after" * 40, NOW, NOW + 1000, 60_000, 3)], NOW)
    store.commit()
    store.close()
    [segment] = os.listdir(tmp_path / "commitlog")
    path = tmp_path / "commitlog" / segment
    data = path.read_bytes()
    record = HEADER_BYTES + torn_at - int(segment[:-4])
    inner_end = data.index(inner.encode(), record) + len(inner)
    record_end = len(data.rstrip(b"\0"))
    with open(path, "r+b") as f:  # the record's last bytes never reached the disk
        f.seek(inner_end)
        f.write(bytes(record_end - inner_end))
    with Store.open(str(tmp_path), now_ms=NOW) as store:
        assert store.log_end_offset == torn_at
        assert store.get("t", "kept") is not None and store.get("t", "torn") is None
