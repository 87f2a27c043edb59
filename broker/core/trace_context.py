"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the
`traceparent` and `tracestate` a send may carry (docs/api.md, "Trace
context"), checked here before a message keeps them. Pure text rules: no
OpenTelemetry (broker.observe.tracing emits spans, when it is on).

    traceparent  version "-" trace-id "-" parent-id "-" trace-flags, lower-case hex:
                 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
                 version     2 hex, not ff; 00 is exactly the 55 characters above;
                             a later version may add fields, each "-" then
                             1 or more lower-case hex (the shape of every
                             field the format has), nothing else after the flags
                 trace-id    32 hex, not all zeros
                 parent-id   16 hex, not all zeros
                 trace-flags 2 hex
    tracestate   list-members joined by "," (spaces and tabs around each
                 allowed, empty ones too), at most MAX_TRACESTATE_MEMBERS
                 and MAX_TRACESTATE_CHARS in all, no key twice:
                 key "=" value, e.g. congo=t61rcWkgMzE,rojo=00f067aa0ba902b7
                 key    lcalpha (lcalpha / digit / _ - * /){0,255}, or
                        tenant "@" system: (lcalpha / digit) then up to 240,
                        "@", lcalpha then up to 13 of the same
                 value  1..256 printable ASCII characters but "," and "=",
                        not ending with a space

Each check returns the text to keep -- a traceparent as given, a
tracestate's list-members joined by "," without the spaces, tabs and empty
members around them (a tab is no header text a push may send on) -- or
raises InvalidRequest naming the parameter.
"""

from __future__ import annotations

import re

from storage.errors import InvalidRequest

# The longest traceparent taken: version 00's 55 characters, with room for
# a later version's extra fields (the spec sets no bound; this one does).
MAX_TRACEPARENT_CHARS = 128
# The spec's bounds on a tracestate a vendor must propagate.
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}((?:-[0-9a-f]+)+)?")
_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"({_KEY})={_VALUE}")


def check_traceparent(value: object, parameter: str = "traceparent") -> str:
    """`value` if it is a valid traceparent; InvalidRequest otherwise."""
    if not isinstance(value, str):
        raise InvalidRequest(parameter, f"must be a string, got {type(value).__name__}")
    if len(value) > MAX_TRACEPARENT_CHARS:
        raise InvalidRequest(parameter, f"must be at most {MAX_TRACEPARENT_CHARS} characters, got {len(value)}")
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        raise InvalidRequest(parameter, f"must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lower case; "
                                        f"a later version may add -<hex> fields), got {value[:60]!r}")
    version, trace_id, parent_id, more = match.groups()
    if version == "ff":
        raise InvalidRequest(parameter, "has version ff, which W3C Trace Context forbids")
    if version == "00" and more is not None:
        raise InvalidRequest(parameter, "of version 00 must be exactly 55 characters")
    if trace_id == "0" * 32:
        raise InvalidRequest(parameter, "has an all-zero trace-id")
    if parent_id == "0" * 16:
        raise InvalidRequest(parameter, "has an all-zero parent-id")
    return value


def check_tracestate(value: object, parameter: str = "tracestate") -> str:
    """`value`'s list-members joined by "," if it is a valid tracestate;
    InvalidRequest otherwise."""
    if not isinstance(value, str):
        raise InvalidRequest(parameter, f"must be a string, got {type(value).__name__}")
    if len(value) > MAX_TRACESTATE_CHARS:
        raise InvalidRequest(parameter, f"must be at most {MAX_TRACESTATE_CHARS} characters, got {len(value)}")
    members = [m.strip(" \t") for m in value.split(",")]
    keys: set[str] = set()
    for i, member in enumerate(members):
        if not member:
            continue  # an empty list-member is allowed (and counts for nothing)
        match = _MEMBER.fullmatch(member)
        if match is None:
            raise InvalidRequest(parameter, f"list-member {i} is not key=value as W3C tracestate has it: "
                                            f"{member[:60]!r}")
        key = match.group(1)
        if key in keys:
            raise InvalidRequest(parameter, f"names the key {key!r} twice")
        keys.add(key)
    if len(keys) > MAX_TRACESTATE_MEMBERS:
        raise InvalidRequest(parameter, f"must hold at most {MAX_TRACESTATE_MEMBERS} list-members, got {len(keys)}")
    return ",".join(member for member in members if member)


def trace_fields(traceparent: object, tracestate: object) -> tuple[str, str]:
    """A send's (traceparent, tracestate), each "" when not given (absent,
    null or ""): a tracestate needs a traceparent."""
    parent = "" if traceparent is None or traceparent == "" else check_traceparent(traceparent)
    state = "" if tracestate is None or tracestate == "" else check_tracestate(tracestate)
    if state and not parent:
        raise InvalidRequest("tracestate", "needs a traceparent beside it")
    return parent, state
