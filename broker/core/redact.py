"""What a client is told of an internal error: its text with file paths
taken out. The log keeps the whole error; an answer never names the data
directory or any file under it (docs/security.md)."""

from __future__ import annotations

import re

# An absolute path: a slash after a space, quote, colon or the start,
# then anything up to a space, quote, comma or closing bracket.
_PATH = re.compile(r"""(?:(?<=^)|(?<=[\s'"(:=\[]))/[^\s'",:)\]]+""")


def client_text(error: BaseException) -> str:
    """`error` as an answer may show it: an OSError by its kind and
    strerror (its filename left out), anything else by its text with
    absolute paths replaced by `<path>`."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.__class__.__name__}: {error.strerror}"
    return _PATH.sub("<path>", str(error) or error.__class__.__name__)
