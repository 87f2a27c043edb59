"""A hand-over's delivery: what a `deliveryId` is (docs/api.md, "Leases").

Every pull (a long poll's, a push's too) hands its messages over under a
new delivery, a 64-bit number:

    bits 63..20   the hand-over's time, epoch ms (until the year 2527)
    bits 19..0    random: two hand-overs in one millisecond differ

The messages of one pull share it; a message's redelivery has a new one.
It is kept with the CONSUMING message -- in RAM, in the pull's record of
the commit log and in the checkpoint (storage.records, storage.checkpoint)
-- so an ack, nack or extension fenced by it is judged alike after a
restart or on a new leader. Its time bounds the lease: an extension may
not keep the message past `--max-lease-ms` from its hand-over.

Clients see it as `deliveryId`, 16 hex digits. Pure functions but
`new_delivery`, which draws its random bits.
"""

from __future__ import annotations

import secrets

from storage.errors import InvalidRequest

RANDOM_BITS = 20
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def new_delivery(now_ms: int) -> int:
    """A new hand-over at `now_ms`."""
    return now_ms << RANDOM_BITS | secrets.randbits(RANDOM_BITS)


def handed_over_ms(delivery: int) -> int:
    """When the hand-over of `delivery` was."""
    return delivery >> RANDOM_BITS


def delivery_id(delivery: int) -> str:
    """`delivery` as clients see it."""
    return f"{delivery:016x}"


def parse_delivery_id(text: str, parameter: str = "deliveryId") -> int:
    """A client's `deliveryId` (16 hex digits, or fewer): its delivery.
    InvalidRequest naming `parameter` for anything else."""
    if not 0 < len(text) <= 16 or not _HEX_DIGITS.issuperset(text):
        raise InvalidRequest(parameter, f"must be a deliveryId (up to 16 hex digits), got {text[:40]!r}")
    delivery = int(text, 16)
    if not delivery:
        raise InvalidRequest(parameter, "must be a deliveryId, not 0")
    return delivery
