"""The calls between the nodes of a cluster, on /_cluster/* of the HTTP
port (bodies in replication.protocol, proof of the cluster secret in
replication.peer_auth): this node's answers to them. This node makes them
through broker.cluster.peer_client.

    call        asked by                answered with
    fetch       a follower (log stream) records after an offset, the tick
                or a candidate (catch-up)
    position    a candidate of term T   this node's promise and log
                                        position; promising T fences older
                                        leaders off this node
    snapshot    a follower whose log    a tar of the store's files
                diverged or fell behind

The `on_*` methods, routed by `add_own_routes`, answer one.
Acknowledgements, positions and promises count only from members of
--cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

from broker.http.api import answer
from broker.http.commands import HERE, CommandTable, ErrorTable
from broker.http.http_types import Request, Response, StreamResponse
from replication import protocol
from replication.log_stream import serve_catchup
from storage.errors import InvalidRequest

from .snapshots import Snapshots
from .state import NodeState

log = logging.getLogger("hourglass.cluster")

# A promise (epoch) this far beyond this node's Raft term is refused: Raft
# terms grow by one an election, and a huge one persisted would stop every
# later election.
MAX_EPOCH_AHEAD = 1000


# A /_cluster/* body that is not its call's message (empty, not msgpack, a
# field missing or of the wrong type: replication.protocol's InvalidRequest)
# is the caller's error, answered HTTP 400, not a bug's 500 with a traceback.
PEER_ERRORS: ErrorTable = ((InvalidRequest, 400, 400),)


class PeerCalls:
    """This node's answers to its peers' calls: from `state`, and a
    snapshot made by `snapshots`."""

    def __init__(self, state: NodeState, snapshots: Snapshots) -> None:
        self.state = state
        self.snapshots = snapshots

    def add_own_routes(self, table: CommandTable) -> None:
        """The calls peers make (the gate checks their proof: routes.py)."""
        table.add("POST", protocol.FETCH_PATH, self.on_fetch, where=HERE, errors=PEER_ERRORS)
        table.add("POST", protocol.POSITION_PATH, self.on_position, where=HERE, errors=PEER_ERRORS)
        table.add("GET", protocol.SNAPSHOT_PATH, self.on_snapshot, where=HERE)

    def _not_a_member(self, message: dict[str, Any]) -> Response | None:
        """Acknowledgements, positions and promises count only from members."""
        node = message.get("node")
        if node not in self.state.cluster.peers or node == self.state.cluster.node_id:
            log.warning("refused a cluster call from %r: not a member of --cluster", node)
            return answer(403, f"{node!r} is not a member of this cluster")
        return None

    async def on_fetch(self, request: Request) -> Response:
        message = protocol.parse_fetch(request.body)  # InvalidRequest: 400 (PEER_ERRORS)
        refused = self._not_a_member(message)
        if refused is not None:
            return refused
        state = self.state
        if message.get("catchup"):
            result = serve_catchup(state.store, state.epochs, message)
        elif state.leader_log is not None and state.leads:
            result = await state.leader_log.fetch(message)
        else:
            result = {"status": "not_leader", "epoch": state.epochs.promised}
        return Response(200, protocol.pack(result), protocol.CONTENT_TYPE)

    async def on_position(self, request: Request) -> Response:
        message = protocol.parse_position(request.body)  # InvalidRequest: 400 (PEER_ERRORS)
        refused = self._not_a_member(message)
        if refused is not None:
            return refused
        state = self.state
        epoch: int = message["epoch"]
        end = state.store.log_end_offset
        ceiling = max(state.election.term, state.epochs.promised) + MAX_EPOCH_AHEAD
        result = {"promised": state.epochs.promised, "end_offset": end, "last_epoch": state.epochs.last_epoch(end),
                  "history": state.epochs.history}
        if epoch > ceiling:
            log.warning("refused a promise of epoch %d from %s: beyond %d", epoch, message.get("node"), ceiling)
            result["status"] = "refused"
        elif epoch < state.epochs.promised or (state.leads and epoch <= state.leading_term):
            result["status"] = "refused"
        else:
            state.set_epochs(state.epochs.promise(epoch))
            result["status"] = "ok"
            result["promised"] = epoch
            if state.leads:  # a newer candidate: this node's term is over
                # At once, not at the role loop's next poll: the candidate
                # catches up to `end` only, and a write answered past it could
                # rest on a follower that has not promised yet (docs/cluster.md).
                # Stopping first: work cut short by the close (a bulk call's
                # slices) is a stop's, not a failure of the broker.
                if state.broker is not None:
                    state.broker.begin_stop()
                if state.leader_log is not None:
                    state.leader_log.close(f"this node promised epoch {epoch} to a newer candidate; retry")
                asyncio.get_running_loop().call_soon(state.deposed.set)
        return Response(200, protocol.pack(result), protocol.CONTENT_TYPE)

    async def on_snapshot(self, request: Request) -> StreamResponse:
        path = await self.snapshots.make_snapshot()

        async def chunks() -> AsyncGenerator[bytes, None]:
            try:  # the file's I/O off the event loop: a snapshot is the whole store
                with await asyncio.to_thread(open, path, "rb") as f:
                    while chunk := await asyncio.to_thread(f.read, 1024 * 1024):
                        yield chunk
            finally:
                os.unlink(path)
        return StreamResponse(chunks(), content_type="application/x-tar",
                              headers={"X-Hourglass-History": json.dumps(self.state.epochs.history)})
