"""The error hierarchy of hourglass.

Expected outcomes (a duplicate id, an unknown message) are return values;
these exceptions mean a broken invariant or a refused request.
"""

from __future__ import annotations


class HourglassError(Exception):
    """Root of every error hourglass raises on purpose."""


class CorruptionError(HourglassError):
    """A file's bytes do not match its format: raised when opening or reading
    finds a bad magic number, version, length or checksum that cannot be a
    torn tail. Names the file, the byte offset and the reason."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class InvalidRequest(HourglassError, ValueError):
    """A caller's input is out of range or malformed; nothing was stored.
    `parameter` names the offending field."""

    def __init__(self, parameter: str, reason: str) -> None:
        super().__init__(f"{parameter}: {reason}")
        self.parameter = parameter
        self.reason = reason


class StoreClosedError(HourglassError):
    """An operation was attempted on a closed store."""


class NotFound(HourglassError):
    """Raised by the broker's calls when no such message or topic exists
    (a status, reschedule or re-drive of an unknown id): HTTP 404."""


class Conflict(HourglassError):
    """Raised when the message's status does not allow the change (a
    reschedule of a consuming message, a re-drive of a live one): code 409."""


class Unavailable(HourglassError):
    """Raised when the node cannot serve now (starting, stopping, a follower
    without a leader, a leader that lost its quorum): HTTP 503."""


class BodyTooLarge(HourglassError):
    """Raised while reading a request when its body passes its byte cap, its
    form pairs or its JSON marks: HTTP 413."""


class InvalidConfig(HourglassError, ValueError):
    """Raised when a configuration is refused: a config dataclass's
    `__post_init__` (or the constructor it stands for) found a setting out
    of range or contradicting another; the message names the setting (as
    its command-line flag where it has one) and what it must be. Nothing
    was started. A ValueError too, as such refusals were before."""


class BrokenInvariant(HourglassError, AssertionError):
    """Raised when code reaches a state its own logic rules out: a bug in
    hourglass, never a caller's mistake (HTTP 500, logged). An
    AssertionError too, as such checks were before."""
