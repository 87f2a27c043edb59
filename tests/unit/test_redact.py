"""broker.core.redact: what a client is told of an internal error names no file."""

import errno

from broker.core.redact import client_text
from storage.errors import CorruptionError

DATA = "/srv/hourglass-data"


def test_an_os_error_is_told_by_its_kind_and_reason_without_its_file():
    error = OSError(errno.ENOSPC, "No space left on device", f"{DATA}/log/00000000000000000000.log")
    assert client_text(error) == "OSError: No space left on device"


def test_paths_inside_a_message_are_taken_out():
    error = CorruptionError(f"{DATA}/hours/2026112318.dlog", 4096, "bad CRC")
    text = client_text(error)
    assert DATA not in text and "corrupt at offset 4096: bad CRC" in text
    assert client_text(RuntimeError(f"syncfs of '{DATA}' failed")) == "syncfs of '<path>' failed"
    assert client_text(RuntimeError("no path here, a/b relative")) == "no path here, a/b relative"
    assert client_text(RuntimeError()) == "RuntimeError"
