"""What a request body may cost to decode: its size, the pairs of a form,
the structure of a JSON text. Checked on the raw bytes, before a decoder
builds anything from them.

Why the structure too: a decoder's objects weigh far more than the bytes
that name them. `{}` is 3 bytes of a list and a 64-byte dict once decoded,
so a 16 MiB body of them became 338 MB; 6 MiB of `&` became six million
empty pairs and stalled the event loop for 2 s. A byte cap alone does not
bound either.

    body                 bound (defaults with --max-msg-bytes 1 MiB)
    any call but batch   6 x max-msg-bytes + 64 KiB             (6.06 MiB)
    sendMsgBatch         that + 4 KiB x --max-batch-msgs        (9.97 MiB)
    form / query string  --max-form-pairs `&`-separated pairs   (1,000)
    JSON, any call       2,112 marks (an ackMsg's or extendMsg's msgIds and deliveryIds:
                         two lists of 1,000 ids)
    JSON, sendMsgBatch   2,112 + 64 x --max-batch-msgs marks    (66,112)

6 x: `msg` escaped the worst way, a control character as JSON's \\u00XX
(%-encoding triples a byte at most). A mark is one of `{ [ , :` outside a
string: about two per key or list item, so an item of up to 30 keys fits
its 64. Decoding a text within these bounds builds at most about 100
bytes of objects per mark beside its strings: a few MB, not hundreds.
Over a bound the answer is code 413, before anything is decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from storage.errors import BodyTooLarge, ConfigError

# Most messages in one sendMsgBatch: the API's bound, and the most
# --max-batch-msgs may allow.
MAX_SEND_BATCH = 1000
# Slack for the rest of a body (keys, topic, ids, numbers) beside `msg`.
BODY_SLACK_BYTES = 64 * 1024
# Slack per sendMsgBatch item for its keys, id, tag and numbers.
BATCH_ITEM_BYTES = 4 * 1024
# JSON marks allowed in any body (two lists of 1,000 ids -- an ackMsg's or
# extendMsg's msgIds and deliveryIds -- and some keys), and per
# sendMsgBatch item on top.
JSON_MARKS_PER_BODY = 2112
JSON_MARKS_PER_ITEM = 64

# A whole JSON string (possessive: a string that never ends is not tried
# again from every quote inside it), a mark (group 1), or a lone quote,
# which opens a string that never ends: the text is not JSON.
_JSON_SCAN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|([{\[,:])|"', re.DOTALL)
_JSON_SCAN_TEXT = re.compile(_JSON_SCAN.pattern.decode(), re.DOTALL)


@dataclass(frozen=True)
class BodyLimits:
    # Most `&`-separated pairs in a form body or query string.
    # --max-form-pairs; no call of the API has more than 15 parameters.
    max_form_pairs: int = 1000
    # Most messages in one sendMsgBatch (--max-batch-msgs), at most the
    # API's MAX_SEND_BATCH. The batch's byte and JSON caps grow with it.
    max_batch_msgs: int = MAX_SEND_BATCH

    def __post_init__(self) -> None:
        if self.max_form_pairs < 16:
            raise ConfigError(f"--max-form-pairs must be at least 16, got {self.max_form_pairs}")
        if not 1 <= self.max_batch_msgs <= MAX_SEND_BATCH:
            raise ConfigError(f"--max-batch-msgs must be in 1..{MAX_SEND_BATCH}, got {self.max_batch_msgs}")

    @staticmethod
    def body_bytes(max_msg_bytes: int) -> int:
        """The byte cap of any call's body but sendMsgBatch's."""
        return 6 * max_msg_bytes + BODY_SLACK_BYTES

    def batch_body_bytes(self, max_msg_bytes: int) -> int:
        return self.body_bytes(max_msg_bytes) + BATCH_ITEM_BYTES * self.max_batch_msgs

    @property
    def batch_json_marks(self) -> int:
        return JSON_MARKS_PER_BODY + JSON_MARKS_PER_ITEM * self.max_batch_msgs

    def check_form(self, raw: bytes | str, what: str) -> None:
        """BodyTooLarge when a form body or query string has more than
        --max-form-pairs `&`-separated pairs."""
        pairs = (raw.count(b"&") if isinstance(raw, bytes) else raw.count("&")) + 1
        if pairs > self.max_form_pairs:
            raise BodyTooLarge(f"{what} has {pairs} parameters, more than {self.max_form_pairs} (--max-form-pairs)")

    def check_batch_msgs(self, count: int) -> None:
        """BodyTooLarge (413: a client splits the batch) when a decoded
        sendMsgBatch holds more than --max-batch-msgs messages."""
        if count > self.max_batch_msgs:
            raise BodyTooLarge(f"msgs holds {count} messages, more than {self.max_batch_msgs} (--max-batch-msgs)")


def check_size(raw: bytes, cap: int) -> None:
    """BodyTooLarge when `raw` is longer than `cap`: the server refuses such
    a body by its Content-Length before reading it, so this is a second
    line of defence."""
    if len(raw) > cap:
        raise BodyTooLarge(f"request body is {len(raw)} bytes, more than {cap}")


def check_json_marks(raw: bytes | str, limit: int, what: str) -> None:
    """Raise BodyTooLarge when more than `limit` of `{ [ , :` stand outside
    strings in `raw`. Costs a byte count, and where that is over the limit
    (marks inside strings count there too) one scan that stops at limit + 1."""
    if len(raw) <= limit:
        return
    matches: Iterator[re.Match[bytes]] | Iterator[re.Match[str]]
    if isinstance(raw, bytes):
        counts = [raw.count(mark) for mark in (b",", b":", b"{", b"[")]
        matches = _JSON_SCAN.finditer(raw)
    else:
        counts = [raw.count(mark) for mark in (",", ":", "{", "[")]
        matches = _JSON_SCAN_TEXT.finditer(raw)
    upper = 0
    for count in counts:
        upper += count
        if upper > limit:
            break
    else:
        return
    marks = 0
    for m in matches:
        if m.lastindex:
            marks += 1
            if marks > limit:
                raise BodyTooLarge(f"{what} holds more than {limit} JSON marks ({{ [ , : outside strings)")
        elif m.end() - m.start() == 1:
            return  # a string that never ends: the decoder refuses the text
