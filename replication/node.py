"""A cluster node: its roles, the moves between them, and failover.

Roles (GET /health says leader or follower; a candidate is shown as follower):

    follower ──Raft elects it in term T──► candidate ──claim committed──► leader
       ▲                                        │                           │
       └──────── no majority / claim fails ─────┘                           │
       └── Raft term moves on, a follower knows a higher epoch, SIGTERM ────┘

Becoming leader of term T (`_lead`), in order:
  1. promise T to itself, then ask every peer for its promise and log
     position (POST /_cluster/position); a majority must answer. A peer
     that promised T takes no record of an older epoch from then on, so
     the old leader can no longer reach a quorum;
  2. catch up: if a peer of the majority has a longer log in a later or
     equal epoch, fetch the difference from it (or a snapshot, if this
     node's tail diverged) -- every record a quorum acknowledged is on at
     least one node of any majority;
  3. replicate claim(T) through Raft; committed means a majority accepted
     term T;
  4. record epoch T from the current log end, open the broker on the
     store (READY/CONSUMING rebuilt from the on-disk status counts) with
     its wheel starting from the tick state the old leader streamed
     (fast-forward if behind the clock, wait if ahead), and serve.

A leader stands down (`_stand_down`) when Raft moves to another term or
leader, when a follower's fetch shows a higher epoch, or when a write
cannot reach its quorum: requests waiting for followers are answered 503
(the client retries them, with the same msgId, on the next leader). Its
log may end with records no quorum has: it rejoins as a follower, the
leader answers its fetch with "diverged", and it takes a snapshot.

SIGTERM on the leader is a graceful handover: stop taking requests, stop
the wheel (its tick persisted), wait until the followers have fetched
everything and the last tick, then leave the Raft group; the next leader
starts exactly where this one stopped, so nothing is delivered twice.

Any node answers any call: a follower forwards API requests to the leader
(503 naming no leader while none is known).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time

import aiohttp

from broker.api import PREFIX, Api, Router, answer, bearer_auth
from broker.camellia_metrics import ProcessStats
from broker.clock import SystemClock
from broker.config import ServeConfig
from broker.console import Console
from broker.httpd import Request, Response, StreamResponse
from broker.metrics import Metrics
from broker.server import camellia_metrics_text, offline_health, serving_status
from broker.service import Broker
from storage.store import Store, text_hash
from wheel.tick_state import TickStateFile

from . import peer_auth, protocol, snapshot
from .config import ClusterConfig
from .election import Election
from .epochs import Epochs
from .log_stream import Follower, LeaderLog, serve_catchup

log = logging.getLogger("hourglass.cluster")

POSITION_TIMEOUT_S = 0.5
HANDOVER_TIMEOUT_S = 3.0
# Headers a forwarded request keeps.
FORWARDED_HEADERS = ("Content-Type", "Authorization", "Accept")
CLUSTER_PREFIX = "/_cluster/"
# A promise (epoch) this far beyond this node's Raft term is refused: Raft
# terms grow by one an election, and a huge one persisted would stop every
# later election.
MAX_EPOCH_AHEAD = 1000


class ClusterNode:
    """One node of a cluster: store, election, follower loop or broker."""

    def __init__(self, config: ServeConfig, cluster: ClusterConfig) -> None:
        self.config = config
        self.cluster = cluster
        self.clock = SystemClock()
        self.data_dir = config.data_path
        os.makedirs(self.data_dir, exist_ok=True)
        snapshot.recover(self.data_dir)  # a snapshot install a crash cut short
        started = time.perf_counter()
        self.store = Store.open(self.data_dir, config.store, now_ms=self.clock.now_ms())
        self.opened_s = time.perf_counter() - started
        self.epochs = Epochs.load(Epochs.path(self.data_dir))
        self.tick_path = os.path.join(self.data_dir, "tick")
        self.tick_file: TickStateFile | None = TickStateFile(self.tick_path, fsync=True)
        self.metrics = Metrics()
        self.process = ProcessStats()
        self.console = Console(lambda: self.store, self.metrics, self._topic_list, self._console_info,
                               self.clock.now_ms)
        self.serving = serving_status(config, lambda: self.broker is not None and self.broker.wake_all())
        # its broker is set while this node leads
        self.api = Api(None, config.max_msg_bytes, config.bodies, self.serving)
        self.apply_lock = asyncio.Lock()
        self.checkpoint_lock = asyncio.Lock()
        self.role = "follower"
        self.broker: Broker | None = None
        self.leader_log: LeaderLog | None = None
        self.leading_term = 0
        self.follower = Follower(self)
        self.election = Election(cluster, self.data_dir)
        self.stopping = False
        self.session: aiohttp.ClientSession | None = None
        self._follow_task: asyncio.Task | None = None
        self._next_try_s = 0.0  # after a failed attempt to lead, wait before the next
        self.on_fatal = None
        self.failed: BaseException | None = None
        log.info("node %s opened %s in %.3f s: %s, %s", cluster.node_id, self.data_dir, self.opened_s,
                 self.store, self.epochs)
        if cluster.secret is None:
            log.warning("--insecure-cluster: no cluster secret, so anyone who reaches the Raft port %s can run code "
                        "on this node and anyone who reaches /_cluster/* is taken for a peer", cluster.me.raft_address)

    # == peers ====================================================================

    async def post(self, node_id: str, call: str, message: dict, timeout_s: float = 5.0) -> dict:
        peer = self.cluster.peers[node_id]
        headers = {"Content-Type": protocol.CONTENT_TYPE,
                   **peer_auth.headers(self.cluster.secret, self.config.auth_token)}
        async with self.session.post(f"{peer.http_url}/_cluster/{call}", data=protocol.pack(message),
                                     headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            body = await r.read()
            if r.status != 200:
                raise ConnectionError(f"{node_id} answered {r.status} to {call}: {body[:200]!r}")
            return protocol.unpack(body)

    def known_leader(self) -> str | None:
        if self.role == "leader":
            return self.cluster.node_id
        term, leader = self.election.claimed
        if leader is None or leader == self.cluster.node_id or term < self.epochs.promised:
            return None
        return leader

    def set_epochs(self, epochs: Epochs) -> None:
        if epochs != self.epochs:
            epochs.save(Epochs.path(self.data_dir))
            self.epochs = epochs

    # == the HTTP app =============================================================

    def handler(self):
        router = Router()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.metrics_text)
        router.add("POST", protocol.FETCH_PATH, self.on_fetch)
        router.add("POST", protocol.POSITION_PATH, self.on_position)
        router.add("GET", protocol.SNAPSHOT_PATH, self.on_snapshot)
        self.serving.add_routes(router)
        self.api.add_routes(router)
        self.console.add_routes(router)

        async def route(request: Request) -> Response | StreamResponse:
            return await self._route(request, router.dispatch)
        api = bearer_auth(self.config.auth_token, self.serving.track(route))
        secret = self.cluster.secret

        async def peers_or_api(request: Request) -> Response | StreamResponse:
            """/_cluster/* needs the cluster secret's proof (the client
            token is not enough); everything else, and /_cluster/* of an
            --insecure-cluster, is the API's."""
            if secret is not None and request.path.startswith(CLUSTER_PREFIX):
                if not peer_auth.is_peer(secret, request.headers.get(peer_auth.HEADER.lower())):
                    return answer(403, "cluster calls need the cluster secret")
                return await router.dispatch(request)
            return await api(request)
        return peers_or_api

    async def _route(self, request: Request, handler):
        """API calls: served here while this node leads, else forwarded."""
        if not request.path.startswith(PREFIX):
            return await handler(request)
        if self.role == "leader" and self.broker is not None and not self.stopping:
            return await handler(request)
        leader = None if self.stopping else self.known_leader()
        if leader is None or leader == self.cluster.node_id:
            return answer(503, "no leader is known yet; retry", leader=None)
        return await self._forward(request, leader)

    async def _forward(self, request: Request, leader: str) -> Response:
        url = self.cluster.peers[leader].http_url + request.path_qs
        headers = {k: request.headers[k.lower()] for k in FORWARDED_HEADERS if k.lower() in request.headers}
        try:
            async with self.session.request(request.method, url, data=request.body, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=None, sock_connect=1.0)) as r:
                data = await r.read()
                return Response(r.status, data, r.headers.get("Content-Type", "application/json"),
                                headers={"X-Hourglass-Leader": leader})
        except (aiohttp.ClientError, OSError) as e:
            return answer(503, f"the leader {leader} is unreachable ({e.__class__.__name__}); retry", leader=leader)

    def _topic_list(self) -> list[str]:
        if self.broker is not None:
            return self.broker.topic_list()
        return sorted(set(self.store.topic_names().values()))

    def _console_info(self) -> dict:
        """The console's node section: role, term, log end and, on the
        leader, each follower's replicated offset and how far it lags."""
        info = {"role": "leader" if self.role == "leader" else "follower", "node": self.cluster.node_id,
                "leader": self.known_leader(),
                "term": self.leading_term if self.role == "leader" else self.election.claimed[0],
                "logEndOffset": self.store.log.end_offset}
        if self.leader_log is not None:
            now_s = time.monotonic()
            info["followers"] = [{"node": name, "offset": p.offset,
                                  "lagBytes": max(0, self.leader_log.durable_offset - p.offset),
                                  "seenAgoMs": int((now_s - p.seen_s) * 1000)}
                                 for name, p in sorted(self.leader_log.followers.items())]
        return info

    async def health(self, request: Request) -> Response:
        # SPEC's roles are leader and follower: a candidate still follows
        extra = {"role": "leader" if self.role == "leader" else "follower", "leader": self.known_leader(),
                 "node": self.cluster.node_id,
                 "term": self.leading_term if self.role == "leader" else self.election.claimed[0],
                 "log_end_offset": self.store.log.end_offset}
        if self.failed is not None:
            return answer(503, f"failed: {self.failed!r}", status="failed", **extra)
        if not self.serving.online:
            return offline_health(**extra)
        return answer(200, "success", status="ok", **extra)

    async def metrics_text(self, request: Request) -> Response:
        gauges = []
        if self.broker is not None:
            for topic in self.broker.topic_list():
                counts = self.store.topic_counts(text_hash(topic))
                gauges.append((topic, counts[1], counts[2], counts[3]))
        node = [("hourglass_commit_log_end_offset", "gauge", self.store.log.end_offset),
                ("hourglass_is_leader", "gauge", int(self.role == "leader")),
                ("hourglass_term", "gauge", self.leading_term if self.role == "leader" else self.election.claimed[0]),
                ("hourglass_replicated_records_total", "counter", self.follower.fetched_records)]
        if self.leader_log is not None:
            node.append(("hourglass_quorum_offset", "gauge", self.leader_log.quorum_offset()))
        text = self.metrics.render(gauges, node) + await camellia_metrics_text(self)
        return Response(200, text.encode(), "text/plain; charset=utf-8")

    def _not_a_member(self, message: dict) -> Response | None:
        """Acknowledgements, positions and promises count only from members."""
        node = message.get("node")
        if node not in self.cluster.peers or node == self.cluster.node_id:
            log.warning("refused a cluster call from %r: not a member of --cluster", node)
            return answer(403, f"{node!r} is not a member of this cluster")
        return None

    async def on_fetch(self, request: Request) -> Response:
        message = protocol.unpack(request.body)
        refused = self._not_a_member(message)
        if refused is not None:
            return refused
        if message.get("catchup"):
            result = serve_catchup(self.store, self.epochs, message)
        elif self.leader_log is not None and self.role == "leader":
            result = await self.leader_log.fetch(message)
        else:
            result = {"status": "not_leader", "epoch": self.epochs.promised}
        return Response(200, protocol.pack(result), protocol.CONTENT_TYPE)

    async def on_position(self, request: Request) -> Response:
        message = protocol.unpack(request.body)
        refused = self._not_a_member(message)
        if refused is not None:
            return refused
        epoch = int(message["epoch"])
        end = self.store.log.end_offset
        ceiling = max(self.election.term, self.epochs.promised) + MAX_EPOCH_AHEAD
        result = {"promised": self.epochs.promised, "end_offset": end, "last_epoch": self.epochs.last_epoch(end),
                  "history": self.epochs.history}
        if epoch > ceiling:
            log.warning("refused a promise of epoch %d from %s: beyond %d", epoch, message.get("node"), ceiling)
            result["status"] = "refused"
        elif epoch < self.epochs.promised or (self.role == "leader" and epoch <= self.leading_term):
            result["status"] = "refused"
        else:
            self.set_epochs(self.epochs.promise(epoch))
            result["status"] = "ok"
            result["promised"] = epoch
            if self.role == "leader":  # a newer candidate: this node's term is over
                asyncio.get_running_loop().call_soon(self._deposed.set)
        return Response(200, protocol.pack(result), protocol.CONTENT_TYPE)

    async def on_snapshot(self, request: Request) -> StreamResponse:
        path = await self.make_snapshot()

        async def chunks():
            try:
                with open(path, "rb") as f:
                    while chunk := f.read(1024 * 1024):
                        yield chunk
            finally:
                os.unlink(path)
        return StreamResponse(chunks(), content_type="application/x-tar",
                              headers={"X-Hourglass-History": json.dumps(self.epochs.history)})

    # == snapshots and checkpoints ================================================

    async def make_snapshot(self) -> str:
        """Copy the store files into a tar (see replication.snapshot) while
        no record is applied; returns its path."""
        path = os.path.join(self.data_dir, f"snapshot-{os.getpid()}-{time.monotonic_ns()}.tar")
        async with self.checkpoint_lock, self.apply_lock:
            end = self.store.log.end_offset
            files = snapshot.capture(self.data_dir, self.store.log.segment_ends())
            size = await asyncio.to_thread(snapshot.write_tar, self.data_dir, files, path)
        log.info("made a snapshot of %d files, %d bytes, up to offset %d", len(files), size, end)
        return path

    async def take_snapshot(self, source: str) -> None:
        """Replace this node's store with `source`'s snapshot."""
        peer = self.cluster.peers[source]
        part = os.path.join(self.data_dir, "snapshot.tar.part")
        headers = peer_auth.headers(self.cluster.secret, self.config.auth_token)
        started = time.perf_counter()
        async with self.session.get(peer.http_url + protocol.SNAPSHOT_PATH, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=600, sock_connect=2)) as r:
            if r.status != 200:
                raise ConnectionError(f"{source} answered {r.status} to a snapshot request")
            history = tuple(tuple(h) for h in json.loads(r.headers["X-Hourglass-History"]))
            with open(part, "wb") as f:
                async for chunk in r.content.iter_chunked(1024 * 1024):
                    f.write(chunk)
        await asyncio.to_thread(snapshot.unpack, part, self.data_dir)  # beside the live store, which stays
        async with self.checkpoint_lock, self.apply_lock:
            self.store.close()
            # On this thread, without a pause: no promise can be made between
            # reading `promised` and the swap that writes it with the store.
            epochs = Epochs(self.epochs.promised, ()).follow(history)
            try:
                snapshot.swap_in(self.data_dir, {os.path.basename(Epochs.path(self.data_dir)): epochs.encode()})
            except BaseException as e:  # a rename failed: the next start finishes the swap
                self.fail(e, "installing a snapshot")
                raise
            self.epochs = epochs
            self.store = await asyncio.to_thread(Store.open, self.data_dir, self.config.store, self.clock.now_ms())
        log.info("installed a snapshot from %s in %.2f s: %s", source, time.perf_counter() - started, self.store)
        await asyncio.to_thread(snapshot.remove_replaced, self.data_dir)

    async def checkpoint(self) -> None:
        async with self.checkpoint_lock:
            broker, now_ms = self.broker, self.clock.now_ms()
            if not self.store.checkpoint_due(now_ms):  # an idle node rewrites nothing
                return
            if broker is not None:
                prepared = await broker.commits.at_quiet_point(lambda: self.store.prepare_checkpoint(now_ms))
            else:
                async with self.apply_lock:
                    prepared = self.store.prepare_checkpoint(now_ms)
            await asyncio.to_thread(self.store.sync_checkpoint)
            keep = self.leader_log.keep_log_from() if self.leader_log is not None else None
            self.store.finish_checkpoint(prepared, keep_log_from=keep)

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            log.critical("%s failed: %r; the node stops", where, error)
            self.failed = error
            if self.on_fatal is not None:
                self.on_fatal(error)

    # == roles ====================================================================

    async def run(self) -> None:
        """Follow, and lead whenever Raft elects this node; until stopped."""
        self._deposed = asyncio.Event()
        self._start_following()
        while not self.stopping:
            await asyncio.sleep(0.02)
            term = self.election.term
            if self.role == "follower":
                if self.election.raft_leader and time.monotonic() >= self._next_try_s:
                    await self._try_to_lead(term)
            elif (reason := self._stand_down_reason()) is not None:
                await self._stand_down(reason)

    def _start_following(self) -> None:
        self.role = "follower"
        self._follow_task = asyncio.create_task(self._follow(), name="follower")

    async def _stop_following(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            await asyncio.gather(self._follow_task, return_exceptions=True)
            self._follow_task = None

    async def _follow(self) -> None:
        while True:
            self.follower.needs_snapshot = None
            await self.follower.run()
            source = self.follower.needs_snapshot
            if source is not None:
                try:
                    await self.take_snapshot(source)
                except Exception as e:
                    log.warning("snapshot from %s failed: %r; retrying", source, e)
                    await asyncio.sleep(0.5)

    def _stand_down_reason(self) -> str | None:
        """Why this leader must stand down now (None: it need not)."""
        election = self.election
        if not election.raft_leader or election.term != self.leading_term:
            return f"Raft moved on (term {election.term}, leader {election.raft_leader_id})"
        if self._deposed.is_set() or (self.leader_log is not None and self.leader_log.deposed.is_set()):
            return "a peer knows a newer epoch"
        if self.broker is not None and self.broker.failed is not None:
            return f"the broker failed: {self.broker.failed!r}"
        return None

    async def _try_to_lead(self, term: int) -> None:
        await self._stop_following()
        self.role = "candidate"
        try:
            led = await self._lead(term)
        except Exception as e:
            log.warning("term %d: could not take the lead: %r", term, e)
            led = False
        if not led:  # Raft may keep this node leader: try again shortly
            self._next_try_s = time.monotonic() + 0.2
            self._start_following()

    async def _lead(self, term: int) -> bool:
        cluster = self.cluster
        self.set_epochs(self.epochs.promise(term))
        end = self.store.log.end_offset
        positions = {cluster.node_id: (self.epochs.last_epoch(end), end, self.epochs.history)}
        answers = await asyncio.gather(*(self.post(p.node_id, "position", {"node": cluster.node_id, "epoch": term},
                                                   POSITION_TIMEOUT_S) for p in cluster.others),
                                       return_exceptions=True)
        for peer, a in zip(cluster.others, answers):
            if isinstance(a, BaseException):
                continue
            if a["status"] != "ok":
                log.info("term %d: %s has promised term %d", term, peer.node_id, a["promised"])
                return False
            positions[peer.node_id] = (int(a["last_epoch"]), int(a["end_offset"]), tuple(map(tuple, a["history"])))
        if len(positions) < cluster.quorum:
            log.info("term %d: %d of %d nodes answered, a majority is needed", term, len(positions), len(cluster.peers))
            return False
        best = max(positions, key=lambda n: positions[n][:2])
        if best != cluster.node_id and positions[best][:2] > positions[cluster.node_id][:2]:
            await self._catch_up(best, positions[best])
        if not self.election.raft_leader or self.election.term != term:
            return False
        if not await self.election.claim(term):
            log.info("term %d: the claim was not committed", term)
            return False
        if self.epochs.promised > term or not self.election.raft_leader:
            log.info("term %d: a newer term appeared while claiming", term)
            return False
        self._start_leading(term)
        return True

    async def _catch_up(self, source: str, position: tuple) -> None:
        last_epoch, target, history = position
        source_epochs = Epochs(0, history)
        end = self.store.log.end_offset
        if source_epochs.diverges(self.epochs.last_epoch(end), end, target):
            log.info("catching up from %s by snapshot (this log diverged at %d)", source, end)
            await self.take_snapshot(source)
            return
        log.info("catching up from %s: offsets %d..%d", source, end, target)
        while self.store.log.end_offset < target:
            end = self.store.log.end_offset
            result = await self.post(source, "fetch", {"node": self.cluster.node_id, "epoch": 0, "offset": end,
                                                       "last_epoch": self.epochs.last_epoch(end), "wait_ms": 0,
                                                       "catchup": True})
            if result["status"] != "ok" or not result.get("records"):
                raise ConnectionError(f"catch-up from {source} stopped at {end}: {result['status']}")
            await self.follower.apply({**result, "tick": None, "history": history})

    def _start_leading(self, term: int) -> None:
        self.set_epochs(self.epochs.begin(term, self.store.log.end_offset))
        self.tick_file.close()
        self.tick_file = None
        self._deposed = asyncio.Event()
        leader_log = LeaderLog(self.store, self.cluster, term, self.epochs, lambda: broker.tick)
        broker = Broker(self.store, self.clock, self.config.defaults, self.metrics, tick_path=self.tick_path,
                        replicated=leader_log.replicated, apply_lock=self.apply_lock, limits=self.config.queues)
        broker.on_fatal = lambda error: None  # a failed broker makes this node stand down
        broker.start()
        self.leader_log, self.broker, self.api.broker = leader_log, broker, broker
        self.leading_term = term
        self.role = "leader"
        self._record_leadership(term, "start")
        log.info("leading term %d from offset %d, tick %s", term, self.store.log.end_offset, broker.tick)

    def _record_leadership(self, term: int, event: str) -> None:
        """leadership.log: one line per start and end of leading, so a drill
        can check that no two nodes ever led the same term."""
        with open(os.path.join(self.data_dir, "leadership.log"), "a") as f:
            f.write(json.dumps({"term": term, "node": self.cluster.node_id, "event": event,
                                "wall_ms": self.clock.now_ms()}) + "\n")

    async def _stand_down(self, reason: str) -> None:
        log.warning("term %d: standing down: %s", self.leading_term, reason)
        self.role = "follower"
        broker, leader_log = self.broker, self.leader_log
        self.broker = self.api.broker = self.leader_log = None
        leader_log.close(f"this node no longer leads ({reason}); retry")
        await broker.abandon()
        self._record_leadership(self.leading_term, "end")
        self.tick_file = TickStateFile(self.tick_path, fsync=True)
        self.follower.last_tick = None
        self._start_following()

    # == stopping =================================================================

    async def handover(self) -> None:
        """SIGTERM: if leading, stop the wheel and commit, let every live
        follower fetch all of it and the last tick, then leave."""
        self.stopping = True
        broker, leader_log = self.broker, self.leader_log
        if broker is not None and leader_log is not None:
            broker.begin_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(broker.stop(), HANDOVER_TIMEOUT_S)
            deadline = time.monotonic() + HANDOVER_TIMEOUT_S
            end = self.store.log.end_offset
            while time.monotonic() < deadline:
                live = [p for p in leader_log.followers.values() if time.monotonic() - p.seen_s < 1.0]
                if live and all(p.offset >= end for p in live):
                    break
                await asyncio.sleep(0.01)
            # one more round, so each follower's last fetch answer carries the final tick
            await asyncio.sleep(2 * self.cluster.tick_sync_ms / 1000)
            leader_log.close("this node is stopping; retry")
            self._record_leadership(self.leading_term, "end")
            log.info("handed over at offset %d, tick %s", end, broker.tick)
        self.election.close()
        await self._stop_following()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.tick_file is not None:
            self.tick_file.close()
        self.store.checkpoint(self.clock.now_ms())
        self.store.close()
