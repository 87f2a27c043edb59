"""The replication protocol: three calls between nodes, on the HTTP port.

Bodies are msgpack maps (Content-Type application/x-msgpack). Every call
carries the proof of the cluster secret (replication.peer_auth; the client
token is not enough: 403), and `node` must be a member of --cluster other
than the callee (else 403): only members are counted or believed.

POST /_cluster/fetch — a follower pulls the leader's commit log (Kafka's
replica fetch). The offset it asks from is everything it has on disk, so
each fetch also acknowledges what came before: the leader counts a record
as replicated when a quorum has fetched past it.

    request  {node, epoch, offset, last_epoch, wait_ms, catchup}
      epoch       the term of the leader the follower follows
      offset      the follower's commit-log end (all of it on its disk)
      last_epoch  epoch of the follower's last record (replication.epochs)
      wait_ms     hold the answer this long if there is nothing new
      catchup     a candidate catching up from a peer that is not the
                  leader: serve whatever log there is, do not wait
    answer   {status, epoch, leader, history, records, end_offset,
              log_start, tick}
      status      "ok"; "diverged" (the follower's tail is not in this
                  log: it must take a snapshot); "snapshot" (the offset
                  is before this log's start); "not_leader"; "stale" (the
                  follower knows a higher epoch: this node is deposed);
                  "not_a_member" (never counted)
      records     [[offset, body], ...] from `offset`, ~1 MiB at most
      end_offset  this node's durable log end
      tick        [hour_tick, second_tick, local_index] or None: the
                  leader's wheel position, sent with every answer, and at
                  least every `tick_sync_ms` (the fetch's wait_ms)

POST /_cluster/position — a candidate asks a peer for its promise and
its log position before it leads.

    request  {node, epoch}
    answer   {status, promised, end_offset, last_epoch, history}
      status  "ok": the peer promises to take no record of an epoch below
              `epoch` from now on; "refused": it has promised a higher
              one, or `epoch` is more than MAX_EPOCH_AHEAD beyond its own
              Raft term and promise (broker.cluster): not persisted

GET /_cluster/snapshot — the whole data directory as a tar stream (see
replication.snapshot), for a follower too far behind, or diverged.

A request body that is not its call's message (empty, not msgpack, not a
map, a field missing or of the wrong type) is the caller's error:
`parse_fetch` and `parse_position` raise InvalidRequest naming the field,
and the node answers HTTP 400 (broker.cluster.routes).
"""

from __future__ import annotations

from typing import Any

import msgpack

from storage.errors import ContractError, InvalidRequest

FETCH_PATH = "/_cluster/fetch"
POSITION_PATH = "/_cluster/position"
SNAPSHOT_PATH = "/_cluster/snapshot"
CONTENT_TYPE = "application/x-msgpack"
FETCH_MAX_BYTES = 1024 * 1024


def pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_bin_type=True)
    return packed


def unpack(data: bytes) -> dict[str, Any]:
    """The map in `data`; ContractError if `data` is not one msgpack map."""
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError) as e:  # msgpack's errors: no data, extra data, bad format or UTF-8, a list as a key
        raise ContractError(f"a replication message must be msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(message, dict):
        raise ContractError("a replication message must be a map")
    return message


# (field, type, default): a default of None means the field is required.
FETCH_FIELDS: tuple[tuple[str, type, object], ...] = (
    ("node", str, None), ("epoch", int, None), ("offset", int, None), ("last_epoch", int, None),
    ("wait_ms", int, 0), ("catchup", bool, False))
POSITION_FIELDS: tuple[tuple[str, type, object], ...] = (("node", str, None), ("epoch", int, None))


def parse_fetch(body: bytes) -> dict[str, Any]:
    """A fetch request, its fields checked (see the table above)."""
    return _parse(body, FETCH_FIELDS)


def parse_position(body: bytes) -> dict[str, Any]:
    """A position request, its fields checked."""
    return _parse(body, POSITION_FIELDS)


def _parse(body: bytes, fields: tuple[tuple[str, type, object], ...]) -> dict[str, Any]:
    try:
        message = unpack(body)
    except ContractError as e:
        raise InvalidRequest("body", str(e)) from None
    for name, kind, default in fields:
        if name not in message and default is not None:
            message[name] = default
        value = message.get(name)
        # bool is an int to Python: neither stands for the other here
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InvalidRequest(name, f"must be {kind.__name__}, got {type(value).__name__}")
        if isinstance(value, int) and value < 0:  # offsets, epochs and waits
            raise InvalidRequest(name, f"must be >= 0, got {value}")
    return message
