"""A shard's side of a node of many shards (docs/internals.md, "Shards").

`ShardRouter` is what the API (broker.http.api) reaches through when the
node runs N > 1 shards: the requests it parsed and validated, whole, go
either to this shard's own engine or, parsed, to the owner's over its link
(broker.shards.link); nothing is parsed or validated twice.

    send, sendMsgBatch   each message to its owner (broker.shards.placement):
                         a send without a msgId gets one this shard owns,
                         so it is stored here; a batch is split by owner,
                         the parts stored at once, answered in the batch's order
    ack, get, delete,    to the msgId's owner; a NotFound there (for an ack:
    reschedule, redrive  no such message) asks the others (a keyed message
                         lives on its key's shard)
    ackMsg msgIds        split by owner, the statuses in the ids' order; the
                         ids an owner has no message of asked of the others
    pull, long poll      this shard's due messages first, then the others'
                         (never early: a shard hands over only its READY
                         ones); a shard that had fewer than asked is skipped
                         until it tells this one the topic has one READY
                         again, which also wakes this shard's long polls
    redriveMsgs jobs     one on every shard under one jobId (broker.jobs.api)
    rates                a topic's releaseRate and a job's rate held node-wide:
                         each shard's share moved by demand (broker.shards.rates)
    the node's views     topic infos, getMonitorData, listMsg (one cursor:
                         the pages merged in (trigger time, msgId) order),
                         listDeadMsg (one cursor: shard by shard), bulk
                         calls, /metrics: every shard's, merged

`serve` answers the calls other shards make of this one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from storage.entry import Message, Status
from storage.errors import InvalidRequest, InvariantError, NotFound, Unavailable
from storage.fileutil import make_dir
from storage.store import NewMessage
from wheel.clock import Clock

from ..backend import MessageRequests, topic_cap_error
from ..core import params
from ..core.bodies import BodyLimits
from ..core.bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, RescheduleMsgsRequest
from ..core.long_polls import LongPolls
from ..core.params import AckRequest, Defaults, DeleteRequest, LongPollRequest, NewSend, PullRequest
from ..disk.backend import Broker
from ..http.commands import Command, Runs
from ..http.http_types import Handler, Request, Response
from ..jobs.runner import RedriveJobs
from ..observe.metrics import Backlog, Metrics
from . import link, placement
from .answers import MERGES, Merge
from .rates import RateShares
from .views import (
    dead_cursor,
    filter_fields,
    filter_of,
    list_fields,
    list_of,
    merge_monitor_data,
    merge_pages,
    merge_topic_infos,
    message_fields,
    message_of,
    messages_of,
    parse_dead_cursor,
    send_of,
)

log = logging.getLogger("hourglass.shards")

def _ignore_outcome(done: asyncio.Future[Any]) -> None:
    """A call made for its side effect only (a hello, a dial back): a shard
    that does not answer is found again by the next call."""
    if not done.cancelled():
        done.exception()


class ShardRouter:
    """This shard (`index` of `count`): its links to the others, and what
    it does with requests of the node that are not its own alone."""

    def __init__(self, index: int, count: int, links_dir: str, bodies: BodyLimits, max_msg_bytes: int) -> None:
        self.index = index
        self.count = count
        self._bodies = bodies
        self._max_msg_bytes = max_msg_bytes
        # (method, path) -> the command as this shard serves it alone: what a forwarded call runs
        self._commands: dict[tuple[str, str], Command] = {}
        self._links_dir = links_dir
        make_dir(links_dir)  # (a long path's sockets are reached through a descriptor of it: link.socket_path)
        self.peers = {i: link.Peer(i, link.socket_path(links_dir, i), self._hear, self._connected)
                      for i in range(count) if i != index}
        # (topic, tags) -> the shards that had fewer READY than asked, skipped by such pulls until they
        # say the topic has one again
        self._drained: dict[tuple[str, tuple[str, ...]], set[int]] = defaultdict(set)
        # (shard, topic) -> the "ready" notices heard from it: a pull marks a shard drained only if none
        # came while it waited for the answer (the notice may be read before the pull resumes)
        self._notices: dict[tuple[int, str], int] = {}
        # topic -> the connections of shards that found this one drained: told when one is READY here
        self._watchers: dict[str, set[link.Connection]] = defaultdict(set)
        # The node's pull order across shards (docs/api.md, "Shards"): topic -> the best priority
        # above 0 this shard told the others it has READY (told again only when it rises above it);
        # (shard, topic) -> what that shard told (or its last pull's answer said) of its own
        self._announced: dict[str, int] = {}
        self._best: dict[tuple[int, str], int] = {}
        self._server: asyncio.AbstractServer | None = None
        self._backend: Broker | None = None
        self._long_polls: LongPolls | None = None
        self.jobs_here: Callable[[], RedriveJobs | None] = lambda: None  # this shard's redriveMsgs jobs
        # the calls a feature of the node answers for the others (op -> its procedure on the args)
        self.ops: dict[str, Callable[[Sequence[Any]], Awaitable[Any]]] = {}
        self._turn = itertools.count()
        # this shard's shares of the node's rates, reported to shard 0's board (broker.shards.rates)
        self.rates = RateShares(self, lambda: self._backend, lambda: self.jobs_here(),
                                lambda: self.backend.clock.monotonic_s())
        self.forwarded = 0  # calls this shard made of others
        self.served = 0  # calls others made of this shard

    def __repr__(self) -> str:
        return f"ShardRouter({self.index} of {self.count}, peers={list(self.peers.values())})"

    # == set-up ================================================================================

    def attach(self, backend: Broker, long_polls: LongPolls) -> None:
        """Serve with this shard's engine; `long_polls` tells when a topic has a READY message."""
        self._backend = backend
        self._long_polls = long_polls
        long_polls.on_wake = self._ready_here

    async def start(self) -> None:
        """Listen for the other shards' calls."""
        make_dir(self._links_dir)
        self._server = await link.listen(link.socket_path(self._links_dir, self.index), self.serve, self._lost)

    async def connect_all(self) -> list[int]:
        """Dial every other shard; the ones that do not answer yet."""
        down = []
        for i, peer in self.peers.items():
            try:
                await peer.connect()
            except Unavailable:
                down.append(i)
        return down

    def down(self) -> list[int]:
        return [i for i, peer in self.peers.items() if not peer.up]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for peer in self.peers.values():
            peer.close()

    @property
    def backend(self) -> Broker:
        if self._backend is None:
            raise Unavailable("the shard is starting; retry")
        return self._backend

    def owns_new(self) -> str:
        """A new msgId this shard owns (a send without one is stored where it arrived)."""
        return placement.new_id_on(self.index, self.count)

    # == the link's two sides ==================================================================

    def drained(self, topic: str, tags: tuple[str, ...]) -> set[int]:
        """The shards a pull of (topic, tags) skips: they had fewer READY than asked, and said nothing since."""
        return self._drained[(topic, tags)]

    def heard(self, shard: int, topic: str) -> int:
        """How many "ready" notices of `topic` `shard` has sent this one."""
        return self._notices.get((shard, topic), 0)

    def _connected(self, shard: int) -> None:
        # a shard (re)connected: what it was known to hold is unknown again; it is told who dialled it,
        # and the best priorities this one has
        for drained in self._drained.values():
            drained.discard(shard)
        for key in [key for key in self._best if key[0] == shard]:
            del self._best[key]
        hello = self.peers[shard].call("hello", [self.index])
        asyncio.ensure_future(hello).add_done_callback(_ignore_outcome)
        for topic, priority in self._announced.items():
            asyncio.ensure_future(self.peers[shard].call("best", [topic, self.index, priority])).add_done_callback(
                _ignore_outcome)

    def announce_all(self) -> None:
        """Tell the others of every topic whose best READY priority here is
        above 0 (at start: what recovery made READY woke no one)."""
        for topic in self.backend.topic_list():
            self._ready_here(topic)

    def heard_best(self, shard: int, topic: str, best: int | None) -> None:
        """`shard`'s best READY priority of `topic` now, as a pull's answer says."""
        if best is not None and best > 0:
            self._best[(shard, topic)] = best
        else:
            self._best.pop((shard, topic), None)

    def best_of(self, shard: int, topic: str) -> int:
        """The best READY priority `shard` has of `topic`, as it last said (0: it said none above 0)."""
        return self._best.get((shard, topic), 0)

    def _tell_best(self, topic: str) -> int | None:
        """This shard's best READY priority of `topic`; the others told if it
        rose above what they were last told (only above 0: a node whose
        messages have no priority tells nothing)."""
        best = self.backend.best_priority(topic)
        told = self._announced.get(topic, 0)
        if best is not None and best > told:
            self._announced[topic] = best
            for peer in self.peers.values():
                asyncio.ensure_future(peer.call("best", [topic, self.index, best])).add_done_callback(_ignore_outcome)
        elif told and (best is None or best < told):
            # fell: the others learn it from their next pull here (its answer says it)
            if best is None or best <= 0:
                del self._announced[topic]
            else:
                self._announced[topic] = best
        return best

    def _hello(self, shard: int) -> None:
        """Shard `shard` dialled this one, having (re)started: it is dialled
        back now, so that a call forwarded to it does not meet the backoff
        of a dial that failed while it was down (a 503 to a client)."""
        peer = self.peers.get(shard)
        if peer is not None and not peer.up:
            peer.heard_from()
            asyncio.ensure_future(peer.connect()).add_done_callback(_ignore_outcome)

    def _lost(self, connection: link.Connection) -> None:
        for watchers in self._watchers.values():
            watchers.discard(connection)

    def _hear(self, op: str, args: Sequence[Any]) -> None:
        if op == "ready":
            topic, shard = args
            self._notices[(shard, topic)] = self._notices.get((shard, topic), 0) + 1
            for (drained_topic, _), drained in self._drained.items():
                if drained_topic == topic:
                    drained.discard(shard)
            if self._long_polls is not None:
                self._long_polls.wake_waiters(topic)

    def _ready_here(self, topic: str) -> None:
        """A message became READY here (LongPolls.wake): tell the shards that
        found none, and all of them if it outranks what they were told."""
        watchers = self._watchers.pop(topic, None)
        if watchers:
            for connection in watchers:
                connection.notify("ready", [topic, self.index])
        if self._backend is not None:
            self._tell_best(topic)

    def call(self, shard: int, op: str, args: list[Any]) -> Awaitable[Any]:
        self.forwarded += 1
        return self.peers[shard].call(op, args)

    async def serve(self, op: str, args: Sequence[Any], connection: link.Connection) -> Any:
        """A call another shard made of this one: the link's own (LINK_OPS),
        the engine's (ENGINE_OPS: a Backend method's name, on this shard's
        engine alone), or a feature's of the node (`ops`)."""
        own = LINK_OPS.get(op)
        if own is not None:
            return await own(self, args, connection)
        self.served += 1
        engine_op = ENGINE_OPS.get(op)
        if engine_op is not None:
            return await engine_op(self.backend, args)
        feature_op = self.ops.get(op)
        if feature_op is None:
            raise InvalidRequest("op", f"no shard call {op!r}")
        return await feature_op(args)

    async def _on_hello(self, args: Sequence[Any], connection: link.Connection) -> None:
        self._hello(int(args[0]))

    async def _on_best(self, args: Sequence[Any], connection: link.Connection) -> None:
        topic, shard, priority = str(args[0]), int(args[1]), int(args[2])
        self._best[(shard, topic)] = priority
        if self._long_polls is not None:
            self._long_polls.wake_waiters(topic)

    async def _on_pull(self, args: Sequence[Any], connection: link.Connection) -> list[Any]:
        """This shard's best READY messages; if fewer than asked, the asker is
        told when one is READY here; the best priority left, as `_tell_best`."""
        self.served += 1
        request: PullRequest | LongPollRequest = PullRequest(*args[0]) if len(args[0]) == 4 \
            else LongPollRequest(*args[0])
        pulled = await self.backend.requests.pull(request)
        if len(pulled) < request.batch:
            self._watchers[request.topic].add(connection)
        return [[message_fields(m) for m in pulled], self._tell_best(request.topic)]

    async def _on_call(self, args: Sequence[Any], connection: link.Connection) -> list[Any]:
        self.served += 1
        return await self._call_here(args)

    async def _on_rates(self, args: Sequence[Any], connection: link.Connection) -> Any:
        self.served += 1
        board = self.rates.board
        if board is None:
            raise InvalidRequest("op", "rates are reported to shard 0")
        return board.report(args[0], args[1], self.backend.clock.monotonic_s())

    # == the node's other commands: routed as whole HTTP requests ===============================

    def route(self, command: Command) -> Command:
        """The command as a shard of the node serves it, as its `where`
        declares (broker.http.commands.Where): forwarded whole to the owner
        of its parameter, or to every shard and merged (broker.shards.answers);
        run here otherwise (HERE, and NODE: its handler reaches the node
        through the node's backend)."""
        self._commands[(command.method, command.path)] = command
        where = command.where
        handler: Handler
        if where.runs is Runs.OWNER:
            handler = functools.partial(self._on_owner, command)
        elif where.runs is Runs.EVERY:
            merge = MERGES.get(where.merge)
            if merge is None:
                raise InvariantError(f"{command.method} {command.path} names no merge there is: {where.merge!r}")
            handler = functools.partial(self._on_every, command, merge)
        else:
            return command
        return dataclasses.replace(command, handler=handler, inline=False)

    def _params(self, request: Request) -> params.Params:
        return params.request_params(request.method, request.query, request.body, request.content_type,
                                     self._bodies, self._max_msg_bytes)

    async def _forward(self, shard: int, command: Command, request: Request) -> Response:
        if shard == self.index:
            return await self._run(command, request)
        status, body, content_type, headers = await self.call(
            shard, "call", [request.method, request.path, request.query, request.body, request.headers,
                            request.at_ms])
        return Response(status, body, content_type, headers)

    async def _run(self, command: Command, request: Request) -> Response:
        """`command` on this shard, its errors answered as its table says."""
        try:
            response = await command.handler(request)
        except Exception as e:
            answer = command.error_answer(e)
            if answer is None:
                raise
            return answer
        if not isinstance(response, Response):
            raise InvalidRequest("path", "streams no answer across shards")
        return response

    async def _call_here(self, args: Sequence[Any]) -> list[Any]:
        method, path, query, body, headers, at_ms = args
        command = self._commands.get((method, path))
        if command is None:
            raise InvalidRequest("path", f"no command {method} {path}")
        request = Request(method, path, query, headers, body, None)
        request.at_ms = at_ms if type(at_ms) is int else None
        response = await self._run(command, request)
        return [response.status, response.body, response.content_type, response.headers]

    async def _on_owner(self, command: Command, request: Request) -> Response:
        """On the shard that owns the value of the command's parameter; a
        request without one is answered here (the error it is)."""
        value = self._params(request).get(command.where.param)
        if not isinstance(value, str) or not value:
            return await self._run(command, request)
        return await self._forward(placement.owner(value, self.count), command, request)

    async def _on_every(self, command: Command, merge: Merge, request: Request) -> Response:
        """Every shard's answer, made one by `merge`. All carry it out at this
        shard's time (`at_ms`: a pause dated alike on every shard, its shift
        or expire over one range)."""
        if request.at_ms is None and self._backend is not None:
            request.at_ms = self._backend.clock.now_ms()
        answers = await asyncio.gather(*[self._forward(i, command, request) for i in range(self.count)])
        return merge(answers, self.index, self._params(request))

    # == fanning out ===========================================================================

    async def everywhere(self, op: str, args: list[Any], here: Callable[[], Awaitable[Any]]) -> list[Any]:
        """`op` on every shard, this one by `here`; the answers in shard order."""
        calls: list[Awaitable[Any]] = []
        for i in range(self.count):
            calls.append(here() if i == self.index else self.call(i, op, args))
        return list(await asyncio.gather(*calls))

    def others(self) -> list[int]:
        """The other shards, from the next one round (pulls spread over them)."""
        start = next(self._turn)
        order = [(self.index + 1 + (start + k) % (self.count - 1)) % self.count for k in range(self.count - 1)]
        return [i for i in order if i != self.index]

    async def by_id(self, msg_id: str, op: str, args: list[Any], here: Callable[[], Awaitable[Any]]) -> Any:
        """`op` on the shard that owns `msg_id`; if it has no such message,
        on the others in turn (a keyed message lives on its key's shard)."""
        first = placement.owner(msg_id, self.count)
        order = [first, *[i for i in range(self.count) if i != first]]
        missing: NotFound | None = None
        for shard in order:
            try:
                return await (here() if shard == self.index else self.call(shard, op, args))
            except NotFound as e:
                missing = missing or e
        assert missing is not None
        raise missing


# -- the engine's calls between shards: a Backend method's name, its arguments as they travel --

async def _send(b: Broker, a: Sequence[Any]) -> Any:
    return [message_fields(m) for m in await b.requests.send([send_of(s) for s in a[0]], a[1])]


async def _give_back(b: Broker, a: Sequence[Any]) -> Any:
    await b.give_back(messages_of(a[0]))


async def _retry_at(b: Broker, a: Sequence[Any]) -> Any:
    status = await b.retry_at(str(a[0]), str(a[1]), int(a[2]))
    return None if status is None else int(status)


async def _ack_many(b: Broker, a: Sequence[Any]) -> Any:
    return [None if s is None else int(s) for s in await b.requests.ack_many(a[0], a[1], a[2])]


async def _get(b: Broker, a: Sequence[Any]) -> Any:
    return message_fields(await b.requests.get(a[0], a[1]))


async def _delete(b: Broker, a: Sequence[Any]) -> Any:
    await b.requests.delete(DeleteRequest(*a))


async def _reschedule(b: Broker, a: Sequence[Any]) -> Any:
    return message_fields(await b.reschedule(a[0], a[1], a[2]))


async def _redrive(b: Broker, a: Sequence[Any]) -> Any:
    return message_fields(await b.redrive(a[0], a[1]))


async def _redrive_all(b: Broker, a: Sequence[Any]) -> Any:
    return list(await b.redrive_all(a[0], a[1]))


async def _list_dead(b: Broker, a: Sequence[Any]) -> Any:
    page, cursor = await b.list_dead(a[0], frozenset(Status(s) for s in a[1]), a[2], a[3])
    return [[message_fields(m) for m in page], cursor]


async def _list_msgs(b: Broker, a: Sequence[Any]) -> Any:
    page, cursor = await b.list_msgs(list_of(a[0]))
    return [[message_fields(m) for m in page], cursor]


async def _count_msgs(b: Broker, a: Sequence[Any]) -> Any:
    return await b.count_msgs(a[0], filter_of(a[1]))


async def _delete_msgs(b: Broker, a: Sequence[Any]) -> Any:
    return list(await b.delete_msgs(DeleteMsgsRequest(a[0], filter_of(a[1]), a[2])))


async def _reschedule_msgs(b: Broker, a: Sequence[Any]) -> Any:
    return list(await b.reschedule_msgs(RescheduleMsgsRequest(a[0], filter_of(a[1]), a[2], a[3], a[4])))


async def _topic_list(b: Broker, a: Sequence[Any]) -> Any:
    return b.topic_list()


async def _topic_infos(b: Broker, a: Sequence[Any]) -> Any:
    return await b.topic_infos(a[0])


async def _topic_backlogs(b: Broker, a: Sequence[Any]) -> Any:
    return {t: list(backlog) for t, backlog in (await b.topic_backlogs()).items()}


async def _monitor_data(b: Broker, a: Sequence[Any]) -> Any:
    return b.metrics.monitor_data()


ENGINE_OPS: dict[str, Callable[[Broker, Sequence[Any]], Awaitable[Any]]] = {
    "send": _send, "give_back": _give_back, "retry_at": _retry_at, "ack_many": _ack_many, "get": _get,
    "delete": _delete, "reschedule": _reschedule, "redrive": _redrive, "redrive_all": _redrive_all,
    "list_dead": _list_dead, "list_msgs": _list_msgs, "count_msgs": _count_msgs, "delete_msgs": _delete_msgs,
    "reschedule_msgs": _reschedule_msgs, "topic_list": _topic_list, "topic_infos": _topic_infos,
    "topic_backlogs": _topic_backlogs, "monitor_data": _monitor_data}

# The link's own calls: a shard's hello and best priority, a pull (it watches for the asker), a
# command forwarded whole, a report of rates to shard 0.
LINK_OPS: dict[str, Callable[[ShardRouter, Sequence[Any], link.Connection], Awaitable[Any]]] = {
    "hello": ShardRouter._on_hello, "best": ShardRouter._on_best, "pull": ShardRouter._on_pull,
    "call": ShardRouter._on_call, "rates": ShardRouter._on_rates}


class ShardedRequests:
    """The message requests of a node of many shards (MessageRequests):
    see the module docstring."""

    def __init__(self, router: ShardRouter, engine: Broker) -> None:
        self._router = router
        self._local = engine.requests
        self._long_polls = engine.long_polls
        self._give_back_here = engine.give_back
        self._best_here = engine.best_priority
        self._has_topic = engine.has_topic
        self._topic_list = engine.topic_list
        self._max_topics = engine.limits.topics
        self._admitted: set[str] = set()  # topics the node was found to have

    def __repr__(self) -> str:
        return f"ShardedRequests({self._router!r})"

    async def send(self, sends: Sequence[NewSend], now_ms: int) -> list[Message]:
        router = self._router
        count, index = router.count, router.index
        topic = sends[0].message.topic if sends else ""
        if sends and topic not in self._admitted and not self._has_topic(topic):
            await self._admit_topic(topic)
        owners = [placement.message_owner(s.message.msg_id, s.message.key, count) for s in sends]
        if all(o == index for o in owners):
            return await self._local.send(sends, now_ms)
        parts: dict[int, list[int]] = defaultdict(list)
        for at, shard in enumerate(owners):
            parts[shard].append(at)
        calls: list[Awaitable[Any]] = []
        for shard, ats in parts.items():
            part = [sends[at] for at in ats]
            if shard == index:
                calls.append(self._local.send(part, now_ms))
            else:
                calls.append(router.call(shard, "send", [[[list(s.message), s.strict, s.skip_after_ms]
                                                            for s in part], now_ms]))
        answers = await asyncio.gather(*calls, return_exceptions=True)
        stored: list[Message | None] = [None] * len(sends)
        failed: BaseException | None = None
        for ats, answer in zip(parts.values(), answers):
            if isinstance(answer, BaseException):
                failed = failed or answer
                continue
            for at, m in zip(ats, answer):
                stored[at] = m if isinstance(m, Message) else message_of(m)
        if failed is not None:  # a part not stored: the client sends the batch again (ids dedup what was)
            raise failed
        return [m for m in stored if m is not None]

    async def _admit_topic(self, topic: str) -> None:
        """A send to a topic this shard has no message of: refused (429) if
        the node has --max-topics topics and none of them is it. (Two
        shards admitting two new topics at once may pass the cap by one
        each: docs/configuration.md, "--shards".)"""
        lists = await self._router.everywhere("topic_list", [], self._topics_here)
        known = set().union(*lists)
        if topic not in known and len(known) >= self._max_topics:
            raise topic_cap_error(len(known), self._max_topics)
        if len(self._admitted) >= 2 * self._max_topics:  # retired topics are asked about again
            self._admitted.clear()
        self._admitted.add(topic)

    async def _topics_here(self) -> list[str]:
        return self._topic_list()

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """The node's best READY messages of the topic (docs/api.md,
        "Shards"). The shards are asked best first: those that said they
        have a higher priority than this one's best, this one, then the
        others; each for the batch's room left and for as many as it may
        outrank of those taken (its best above theirs: a shard that said
        nothing above 0 may hold 0). Of all taken, the batch's best in pull
        order (priority, then trigger time) are the answer; the rest are
        given back, READY again on their shards."""
        router = self._router
        topic = request.topic
        drained = router.drained(topic, request.tags)
        here = self._best_here(topic)
        others = [shard for shard in router.others() if shard not in drained]
        # the others by what they said, best first: above this shard's best before it, the rest after
        said = sorted(((router.best_of(shard, topic), shard) for shard in others), key=lambda b: -b[0])
        order: list[tuple[int | None, int]] = [(best, shard) for best, shard in said if here is None or best > here]
        if here is not None:  # (None: nothing READY here)
            order.append((here, router.index))
        order += [(best, shard) for best, shard in said if here is not None and best <= here]
        pulled: list[Message] = []
        for best, shard in order:
            want = request.batch - len(pulled)
            if best is not None:
                want += sum(1 for m in pulled if m.priority < best)
            if want <= 0:
                continue
            if shard == router.index:
                pulled += await self._local.pull(request._replace(batch=want))
            else:
                pulled += await self._pull_from(shard, request, want, drained)
        if len(pulled) > 1:  # one pull's answer in pull order, whichever shard each came from
            pulled.sort(key=lambda m: (-m.priority, m.trigger_ms))
        if len(pulled) > request.batch:  # outranked by another shard's: READY again where it is
            await self._give_back(pulled[request.batch:])
            del pulled[request.batch:]
        return pulled

    async def _pull_from(self, shard: int, request: PullRequest | LongPollRequest, want: int,
                         drained: set[int]) -> list[Message]:
        """Up to `want` of `shard`'s best (taken there: CONSUMING); its best
        priority after, as its answer says, kept for the next pulls."""
        router = self._router
        heard = router.heard(shard, request.topic)
        try:
            rows, best = await router.call(shard, "pull", [list(request._replace(batch=want))])
        except Unavailable:
            return []
        router.heard_best(shard, request.topic, best)
        if len(rows) < want and router.heard(shard, request.topic) == heard:
            drained.add(shard)
        return messages_of(rows)

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool]) -> list[Message]:
        # wait_before_pull: a pull here awaits other shards' answers, and a
        # wake (another shard's "ready" notice, a resume) that comes meanwhile
        # must count, or the poll sleeps to its timeout with a message ready
        return await self._long_polls.wait_ready(request.topic, request.long_polling_timeout_ms,
                                                 lambda: self.pull(request), self._give_back, gone,
                                                 wait_before_pull=True)

    async def _give_back(self, messages: list[Message]) -> None:
        router = self._router
        by_shard: dict[int, list[Message]] = defaultdict(list)
        for m in messages:
            by_shard[placement.message_owner(m.msg_id, m.key, router.count)].append(m)
        for shard, part in by_shard.items():
            if shard == router.index:
                await self._give_back_here(part)
            else:
                await router.call(shard, "give_back", [[message_fields(m) for m in part]])

    def ack(self, request: AckRequest) -> Awaitable[object]:
        return self.ack_many(request.topic, (request.msg_id,), request.ack)

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """Each id acked by its msgId's owner; an id that shard has no
        message of is asked of the others in turn (a keyed message lives on
        its key's shard: acked at its msgId's alone, it would be left
        consuming and delivered again after its ack timeout)."""
        router = self._router
        statuses: list[Status | None] = [None] * len(msg_ids)
        missing = list(range(len(msg_ids)))
        first = {at: placement.owner(msg_ids[at], router.count) for at in missing}
        for turn in range(router.count):
            parts: dict[int, list[int]] = defaultdict(list)
            for at in missing:
                parts[(first[at] + turn) % router.count].append(at)
            calls: list[Awaitable[Any]] = []
            for shard, ats in parts.items():
                ids = [msg_ids[at] for at in ats]
                calls.append(self._local.ack_many(topic, ids, ack) if shard == router.index
                             else router.call(shard, "ack_many", [topic, ids, ack]))
            for (_, ats), answer in zip(parts.items(), await asyncio.gather(*calls)):
                for at, status in zip(ats, answer):
                    statuses[at] = None if status is None else Status(status)
            missing = [at for at in missing if statuses[at] is None]
            if not missing:
                break
        return statuses

    async def delete(self, request: DeleteRequest) -> None:
        await self._router.by_id(request.msg_id, "delete", list(request), lambda: self._local.delete(request))

    async def get(self, topic: str, msg_id: str) -> Message:
        found = await self._router.by_id(msg_id, "get", [topic, msg_id], lambda: self._local.get(topic, msg_id))
        return found if isinstance(found, Message) else message_of(found)


class ShardedBackend:
    """The Backend the API serves a node of many shards with: this shard's
    engine for what is its own, the router for what is the node's."""

    def __init__(self, router: ShardRouter, local: Broker) -> None:
        self._router = router
        self._local = local
        self.clock: Clock = local.clock
        self.defaults: Defaults = local.defaults
        self.metrics: Metrics = local.metrics
        self.on_fatal = local.on_fatal
        self._requests = ShardedRequests(router, local)

    def __repr__(self) -> str:
        return f"ShardedBackend({self._router!r})"

    @property
    def requests(self) -> MessageRequests:
        return self._requests

    @property
    def failed(self) -> BaseException | None:
        return self._local.failed

    async def send(self, sends: Sequence[NewSend | NewMessage]) -> list[Message]:
        return await self._local.send(sends)

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        return await self._requests.pull(request)

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        return await self._requests.long_poll(request, gone)

    async def ack(self, request: AckRequest) -> None:
        await self._requests.ack(request)

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        return await self._requests.ack_many(topic, msg_ids, ack)

    async def delete(self, request: DeleteRequest) -> None:
        await self._requests.delete(request)

    async def get(self, topic: str, msg_id: str) -> Message:
        return await self._requests.get(topic, msg_id)

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        found = await self._router.by_id(msg_id, "reschedule", [topic, msg_id, trigger_ms],
                                         lambda: self._local.reschedule(topic, msg_id, trigger_ms))
        return found if isinstance(found, Message) else message_of(found)

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        """A failed push (the pusher of a topic pushes every shard's
        messages): on the shard whose message is in flight, the msgId's
        first (a keyed one lives on its key's: the others then, in turn)."""
        router = self._router
        first = placement.owner(msg_id, router.count)
        for shard in [first, *[i for i in range(router.count) if i != first]]:
            if shard == router.index:
                status = await self._local.retry_at(topic, msg_id, at_ms)
            else:
                found = await router.call(shard, "retry_at", [topic, msg_id, at_ms])
                status = None if found is None else Status(found)
            if status is not None:
                return status
        return None

    async def give_back(self, messages: list[Message]) -> None:
        await self._local.give_back(messages)

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        router = self._router
        shard, inner = parse_dead_cursor(cursor, router.count)
        page: list[Message] = []
        while True:
            if shard == router.index:
                got, inner = await self._local.list_dead(topic, statuses, inner, limit - len(page))
            else:
                rows, inner = await router.call(shard, "list_dead",
                                                [topic, sorted(int(s) for s in statuses), inner, limit - len(page)])
                got = messages_of(rows)
            page.extend(got)
            if inner is not None:  # this shard has more: the next page goes on here
                return page, dead_cursor(shard, inner)
            shard += 1
            if shard == router.count:
                return page, None
            if len(page) >= limit:
                return page, dead_cursor(shard, None)

    async def redrive(self, topic: str, msg_id: str) -> Message:
        found = await self._router.by_id(msg_id, "redrive", [topic, msg_id],
                                         lambda: self._local.redrive(topic, msg_id))
        return found if isinstance(found, Message) else message_of(found)

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        router = self._router
        done, more = 0, False
        for shard in range(router.count):
            if done >= limit:
                return done, True
            if shard == router.index:
                n, more = await self._local.redrive_all(topic, limit - done)
            else:
                n, more = await router.call(shard, "redrive_all", [topic, limit - done])
            done += n
        return done, more

    async def list_msgs(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        """Every shard's page after the cursor, merged in page order and cut
        to the limit; the cursor after the last one kept, if any shard has more."""
        router = self._router
        answers = await router.everywhere("list_msgs", [list_fields(request)],
                                          lambda: self._local.list_msgs(request))
        return merge_pages([([m if isinstance(m, Message) else message_of(m) for m in got], cursor)
                            for got, cursor in answers], request.limit)

    async def count_msgs(self, topic: str, flt: BulkFilter) -> int:
        counts = await self._router.everywhere("count_msgs", [topic, filter_fields(flt)],
                                               lambda: self._local.count_msgs(topic, flt))
        return sum(counts)

    async def delete_msgs(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        """Shard by shard, each its part whole, up to the limit in all."""
        router = self._router
        fields = filter_fields(request.filter)

        def on(shard: int, limit: int) -> Awaitable[Any]:
            if shard == router.index:
                return self._local.delete_msgs(request._replace(limit=limit))
            return router.call(shard, "delete_msgs", [request.topic, fields, limit])
        return await self._in_turn(request.topic, request.filter, request.limit, on)

    async def reschedule_msgs(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        """Shard by shard, each its part whole, up to the limit in all."""
        router = self._router
        fields = filter_fields(request.filter)

        def on(shard: int, limit: int) -> Awaitable[Any]:
            if shard == router.index:
                return self._local.reschedule_msgs(request._replace(limit=limit))
            return router.call(shard, "reschedule_msgs", [request.topic, fields, limit, request.shift_ms,
                                                          request.trigger_ms])
        return await self._in_turn(request.topic, request.filter, request.limit, on)

    async def _in_turn(self, topic: str, flt: BulkFilter, limit: int,
                       on: Callable[[int, int], Awaitable[Any]]) -> tuple[int, bool]:
        """A bulk call on each shard in turn with what is left of `limit`;
        how many in all, and whether matches are left on any shard."""
        done = 0
        for shard in range(self._router.count):
            if done >= limit:  # the limit reached: more if a shard not asked has a match
                for rest in range(shard, self._router.count):
                    if await self._count_on(rest, topic, flt):
                        return done, True
                return done, False
            n, more = await on(shard, limit - done)
            done += n
            if more:
                return done, True
        return done, False

    async def _count_on(self, shard: int, topic: str, flt: BulkFilter) -> int:
        if shard == self._router.index:
            return await self._local.count_msgs(topic, flt)
        count: int = await self._router.call(shard, "count_msgs", [topic, filter_fields(flt)])
        return count

    async def topic_info(self, topic: str) -> dict[str, object]:
        return (await self.topic_infos([topic]))[0]

    async def topic_infos(self, topics: Sequence[str]) -> list[dict[str, object]]:
        answers = await self._router.everywhere("topic_infos", [list(topics)],
                                                lambda: self._local.topic_infos(topics))
        return [merge_topic_infos(infos) for infos in zip(*answers)]

    async def all_topics(self) -> list[str]:
        """The topics any shard knows, sorted."""
        lists = await self._router.everywhere("topic_list", [], self._local_topics)
        return sorted(set().union(*lists))

    async def _local_topics(self) -> list[str]:
        return self._local.topic_list()

    def topic_list(self) -> list[str]:
        return self._local.topic_list()

    async def topic_backlogs(self) -> dict[str, Backlog]:
        return await self._local.topic_backlogs()

    async def monitor_data(self) -> dict[str, Any]:
        parts = await self._router.everywhere("monitor_data", [], self._local_monitor_data)
        return merge_monitor_data(parts)

    async def _local_monitor_data(self) -> dict[str, Any]:
        return self._local.metrics.monitor_data()

    def wake_all(self) -> None:
        self._local.wake_all()

    def begin_stop(self) -> None:
        self._local.begin_stop()

    async def stop(self) -> None:
        await self._local.stop()


async def scheduled_on_owners(router: ShardRouter, here: Callable[[str, Sequence[str]], Awaitable[set[str]]],
                              topic: str, schedule_ids: Sequence[str]) -> set[str]:
    """Which of `schedule_ids` are schedules of `topic`, asked of each one's owner."""
    parts: dict[int, list[str]] = defaultdict(list)
    for sid in schedule_ids:
        parts[placement.owner(sid, router.count)].append(sid)
    found: set[str] = set()
    for shard, ids in parts.items():
        found.update(await here(topic, ids) if shard == router.index else await router.call(shard, "scheduled",
                                                                                            [topic, ids]))
    return found
