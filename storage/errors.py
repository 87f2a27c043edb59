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


class NewerFormatError(CorruptionError):
    """A file of the data directory was written by a newer hourglass, in a
    format version this build does not read (its u16 version, at byte 4,
    above the newest this build knows): raised on opening, before anything
    in the directory is written. A CorruptionError (the file cannot be
    read), but never taken for damage: where damage to a derived file is
    repaired by rebuilding it (the id and key indexes), this one is re-
    raised, so the directory is refused as it is. Names the file and both
    versions, and says what to do (docs/operations.md, "Upgrades and
    downgrades")."""

    def __init__(self, path: str, found: int, reads: int) -> None:
        HourglassError.__init__(self, f"{path}: written by a newer hourglass (format {found}; this one reads "
                                      f"{reads}): run that version or a later one on this data directory, or "
                                      f"restore the copy taken before the upgrade (docs/operations.md, "
                                      f"\"Upgrades and downgrades\")")
        self.path = path
        self.offset = 4
        self.reason = f"format version {found}, newer than {reads}"
        self.found = found
        self.reads = reads


class OlderFormatError(CorruptionError):
    """A file of the data directory is of a format version this build no
    longer reads and no release converts (its u16 version, at byte 4):
    raised on opening, before anything in the directory is written, as
    NewerFormatError is. `advice` says what wrote it and what to do
    (docs/operations.md, "Upgrades and downgrades")."""

    def __init__(self, path: str, found: int, reads: int, advice: str) -> None:
        HourglassError.__init__(self, f"{path}: format {found}, older than this hourglass reads ({reads}): {advice} "
                                      f"(docs/operations.md, \"Upgrades and downgrades\")")
        self.path = path
        self.offset = 4
        self.reason = f"format version {found}, older than {reads}"
        self.found = found
        self.reads = reads


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


class LimitReached(HourglassError):
    """Raised by a request that would take the node past a limit it keeps
    for all clients together (a send to a new topic once --max-topics
    topics exist): HTTP 429, the message naming the flag; nothing was
    stored."""


class Forbidden(HourglassError):
    """Raised when the node's configuration does not allow what a request
    asks for (a push subscription to a URL --push-allow does not name):
    code 403, the message naming the flag; nothing was stored."""


class BodyTooLarge(HourglassError):
    """Raised while reading a request when its body passes its byte cap, its
    form pairs or its JSON marks: HTTP 413."""


class InvariantError(HourglassError, AssertionError):
    """The code's own state contradicts itself (an index entry staged out of
    order, a change for a message that is neither applied nor pending, a
    second added outside the hour the wheel holds, a format's struct of the
    wrong size, a broker state its own logic rules out): a bug in hourglass,
    never an expected outcome and never the caller's input (HTTP 500,
    logged). Raised where the broken rule is found, naming it. An
    AssertionError too, as such checks were before."""


class ContractError(HourglassError, ValueError):
    """A caller broke a method's contract (a replicated record that does not
    continue the log, a read from outside the log, a tick state out of
    range or written to a closed file, an hour cascaded before the wheel
    reached it, bytes handed over as a delay-log body that are none): the
    call does nothing. A ValueError too, as it was (recovery turns one met
    while replaying the log into a CorruptionError naming the offset)."""


class DataDirError(HourglassError):
    """A data directory a node must not start on: raised at start-up,
    before the store opens it, when it cannot be created, is not a
    directory, is on a read-only file system or not writable by this user,
    or when group or others may reach it (storage.data_dir). The message is
    one sentence naming the path and what to do about it."""


class ConfigError(HourglassError, ValueError):
    """A configuration is refused: raised when a config dataclass or a
    component is built (its `__post_init__` or constructor) and finds a
    setting out of range or contradicting another; the message names the
    setting (as its command-line flag where it has one) and what it must
    be. Nothing was started. A ValueError too, so the CLI reports it as it
    does any bad flag."""
