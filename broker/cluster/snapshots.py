"""Snapshots and checkpoints of a cluster node's store.

A follower whose log diverged from the leader's, or fell behind the log
the leader keeps, replaces its store with a snapshot of a peer's:

    peer                                  this node
    make_snapshot: tar of the store's     take_snapshot: download it beside
    files, taken while nothing is         the live store, unpack it, then
    applied (replication.snapshot)        close the store, swap the files in
                                          with the peer's epoch history, and
                                          reopen (a crash mid-swap is finished
                                          by the next start); once downloaded,
                                          an install runs to its end even if
                                          the node is elected meanwhile

`checkpoint` runs every checkpoint interval, as on a standalone node; a
leader keeps the commit log its followers still need.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable

import aiohttp

from replication import protocol, snapshot
from replication.epochs import Epochs
from storage.errors import Unavailable
from storage.store import Store

from .peer_client import PeerClient
from .state import NodeState

log = logging.getLogger("hourglass.cluster")


class Snapshots:
    """The snapshots and checkpoints of `state`'s store; a snapshot taken
    is downloaded through `peers`."""

    def __init__(self, state: NodeState, peers: PeerClient) -> None:
        self.state = state
        self.peers = peers
        self._install_task: asyncio.Task[None] | None = None  # an install under way (take_snapshot)

    async def make_snapshot(self) -> str:
        """Copy the store files into a tar (see replication.snapshot) while
        no record is applied; returns its path."""
        state = self.state
        path = os.path.join(state.data_dir, f"snapshot-{os.getpid()}-{int(state.clock.monotonic_s() * 1e9)}.tar")
        async with state.checkpoint_lock, state.apply_lock:
            end = state.store.log_end_offset
            files = snapshot.capture(state.data_dir, state.store.log_segment_ends())
            size = await asyncio.to_thread(snapshot.write_tar, state.data_dir, files, path)
        log.info("made a snapshot of %d files, %d bytes, up to offset %d", len(files), size, end)
        return path

    async def quiet_point(self, run: Callable[[], object]) -> object:
        """`run` with everything appended applied and nothing applied
        meanwhile (an online backup's second step, broker.disk.backups):
        the lead's group commit's quiet point on a leader, the apply lock
        on a follower."""
        state = self.state
        if state.broker is not None:
            return await state.broker.commits.at_quiet_point(run)
        async with state.apply_lock:
            state.store.commit()
            return run()

    async def take_snapshot(self, source: str) -> None:
        """Replace this node's store with `source`'s snapshot.

        The download may be cancelled (the follower stops: an election,
        SIGTERM). The install after it is not: it runs to its end in a task
        of its own (`finish_install` waits for it), so no worker thread of
        an abandoned install goes on unpacking into snapshot.new, or
        deleting snapshot.old, while this node takes another snapshot or
        leads (an election during an install cancelled it there, and the
        candidate's own catch-up by snapshot met its thread)."""
        await self.finish_install()  # one install at a time
        started_s = self.state.clock.monotonic_s()
        part, history = await self.download_snapshot(source)
        install = asyncio.create_task(self._install(source, part, history, started_s), name="snapshot-install")
        self._install_task = install
        try:
            await asyncio.shield(install)
        finally:
            if install.done():  # (cancelled before: finish_install waits for it, and says how it ended)
                self._install_task = None

    async def download_snapshot(self, source: str) -> tuple[str, tuple[tuple[int, int], ...]]:
        """`source`'s snapshot, as a tar beside the store; its path and the
        epoch history that goes with it."""
        peer = self.state.cluster.peers[source]
        part = os.path.join(self.state.data_dir, "snapshot.tar.part")
        async with self.peers.session().get(peer.http_url + protocol.SNAPSHOT_PATH, headers=self.peers.headers(),
                                            timeout=aiohttp.ClientTimeout(total=600, sock_connect=2)) as r:
            if r.status != 200:
                raise ConnectionError(f"{source} answered {r.status} to a snapshot request")
            history = tuple((int(epoch), int(offset)) for epoch, offset in json.loads(r.headers["X-Hourglass-History"]))
            with await asyncio.to_thread(open, part, "wb") as f:  # the file's I/O off the event loop
                async for chunk in r.content.iter_chunked(1024 * 1024):
                    await asyncio.to_thread(f.write, chunk)
        return part, history

    async def finish_install(self) -> None:
        """Return once no snapshot install runs: one that a cancelled
        follower left running ends first (a failure logged, and one that
        left no store to serve from has failed the node)."""
        install = self._install_task
        if install is None:
            return
        await asyncio.wait([install])  # (a cancel of this wait leaves the install running)
        self._install_task = None
        if not install.cancelled() and install.exception() is not None:
            log.warning("snapshot install failed: %r", install.exception())

    async def _install(self, source: str, part: str, history: tuple[tuple[int, int], ...], started_s: float) -> None:
        state = self.state
        await asyncio.to_thread(snapshot.unpack, part, state.data_dir)  # beside the live store, which stays
        async with state.checkpoint_lock, state.apply_lock:
            state.store.close()
            # On this thread, without a pause: no promise can be made between
            # reading `promised` and the swap that writes it with the store.
            epochs = Epochs(state.epochs.promised, ()).follow(history)
            try:
                snapshot.swap_in(state.data_dir, {os.path.basename(Epochs.path(state.data_dir)): epochs.encode()})
                state.set_epochs(epochs, saved=True)
                # On the event loop too, blocking it for the open (the restart
                # time: about 1 s at 10 M messages): with a pause here, /health,
                # /_cluster/position and /fetch ran on the closed store (a 500,
                # seen by a fault drill) or answered its old end with the new epochs.
                state.store = Store.open(state.data_dir, state.config.store, state.clock.now_ms())
            except BaseException as e:
                # The old store is closed: a rename that failed (the next
                # start finishes the swap) or a new store that does not open
                # leaves nothing to serve or follow from.
                state.fail(e, "installing a snapshot")
                raise
        log.info("installed a snapshot from %s in %.2f s: %s", source, state.clock.monotonic_s() - started_s,
                 state.store)
        await asyncio.to_thread(snapshot.remove_replaced, state.data_dir)

    async def checkpoint(self) -> None:
        state = self.state
        async with state.checkpoint_lock:
            broker, now_ms = state.broker, state.clock.now_ms()
            if not state.store.checkpoint_due(now_ms):  # an idle node rewrites nothing
                return
            if broker is not None:
                try:
                    prepared = await broker.prepared_at_quiet_point(lambda: state.store.prepare_checkpoint(now_ms))
                except Unavailable:
                    if state.broker is broker:
                        raise
                    return  # this node stopped leading meanwhile: the next interval checkpoints as a follower
            else:
                async with state.apply_lock:
                    state.store.commit()  # (what a fetch appended, applied: a PART or an INTENT among it shows)
                    if state.store.parts_held():  # a bulk call's PART came while the lock was awaited
                        return
                    prepared = state.store.prepare_checkpoint(now_ms)
            await asyncio.to_thread(state.store.sync_checkpoint)
            keep = state.leader_log.keep_log_from() if state.leader_log is not None else None
            state.store.finish_checkpoint(prepared, keep_log_from=keep)
