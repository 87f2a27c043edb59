"""A shard's side of a node of many shards (docs/internals.md, "Shards"):
its links to the other shards and what travels on them.

    open        listen, dial every other shard (waiting for all: the node's
                shards start together), then keep the links up; `close`
    serve       the calls other shards make of this one: the link's own
                (hello, best, pull, call, rates), the engine's (ENGINE_OPS:
                a Backend method's name, run on this shard's engine alone),
                and the ones the node's features register (`ops`: metrics,
                port, scheduled, jobs, the console's)
    route       a command as its `where` declares (broker.http.commands):
                forwarded whole to the owner of a parameter, or to every
                shard with a merge (broker.shards.answers)
    head        (priority, trigger time) of this shard's best READY message
                of a topic, told each other shard when it betters what that
                one was told; what each told, for the node's pull order
    rates       a topic's releaseRate and a job's rate held node-wide: each
                shard's share moved by demand (broker.shards.rates)

The node's Backend over these links is broker.shards.backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import os
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from storage.entry import Status
from storage.errors import InvalidRequest, InvariantError, NotFound, Unavailable
from storage.fileutil import DIR_MODE, make_dir

from ..core import params
from ..core.bodies import BodyLimits
from ..core.bulk_params import DeleteMsgsRequest, RescheduleMsgsRequest
from ..core.long_polls import LongPolls
from ..core.params import DeleteRequest, LongPollRequest, PullRequest
from ..disk.backend import Broker
from ..http.commands import Command, Runs
from ..http.http_types import Handler, Request, Response
from ..jobs.runner import RedriveJobs
from ..tasks import cancel_and_wait
from . import link, placement
from .answers import CODE_ONLY_MERGES, MERGES, SUCCESS_ONLY, Merge, succeeded
from .rates import RateShares
from .views import (
    fenced_of,
    fencings_fields,
    filter_of,
    list_of,
    message_fields,
    messages_of,
    send_of,
)

log = logging.getLogger("hourglass.shards")

# (priority, triggerTime) of a shard's best READY message of a topic: what a pull there takes first
Head = tuple[int, int]
# Within a priority, a shard's message outranks another's due more than this after it (docs/api.md,
# "Shards"): messages due about together are taken where the pull is, with no hop to sort them
ORDER_SLACK_MS = 100
# How often a shard dials the shards of its node it has no link to.
LINK_RETRY_S = 0.25


def outranks(head: Head | None, priority: int, trigger_ms: int) -> bool:
    """Whether a shard whose best READY message is `head` holds one a pull
    takes before a message of (priority, trigger_ms). A shard that told
    nothing (None) may hold priority 0, due whenever."""
    if head is None:
        return priority < 0
    return head[0] > priority or (head[0] == priority and head[1] + ORDER_SLACK_MS < trigger_ms)


def _betters(head: Head | None, told: Head | None) -> bool:
    """Whether `head` is a better best than `told` (what a shard was told): a higher priority, or
    an earlier trigger time within it."""
    return head is not None and (told is None or head[0] > told[0] or (head[0] == told[0] and head[1] < told[1]))


def _head_of(said: Sequence[Any]) -> Head | None:
    """The head a shard said: [its saying's number, priority, trigger time], or [number] (none)."""
    return (int(said[1]), int(said[2])) if len(said) == 3 else None


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
        # topic -> the shards that found this one drained (their connections): told when one is READY here
        self._watchers: dict[str, dict[link.Connection, int]] = defaultdict(dict)
        # The node's pull order across shards (docs/api.md, "Shards"): (shard, topic) -> the head this
        # shard last told that shard it has (a notice, a tell or a pull's answer; told again when its
        # head betters it); (shard, topic) -> the head that shard told of its own
        self._told: dict[tuple[int, str], Head] = {}
        self._heads: dict[tuple[int, str], Head] = {}
        # Each head said is numbered (one count for all this shard says): a pull's answer and a tell
        # travel on the two connections of a pair of shards, so one said later may be read first;
        # (shard, topic) -> the number of the last heard, older ones ignored.
        self._sayings = itertools.count(1)
        self._heard_numbers: dict[tuple[int, str], int] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[Any]] = []  # while open: the links kept up, the rates' shares moved
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
        self.on_connected: Callable[[int], None] | None = None  # told each shard (re)connected

    def __repr__(self) -> str:
        return f"ShardRouter({self.index} of {self.count}, peers={list(self.peers.values())})"

    # == set-up ================================================================================

    def attach(self, backend: Broker, long_polls: LongPolls) -> None:
        """Serve with this shard's engine; `long_polls` tells when a topic has a READY message."""
        self._backend = backend
        self._long_polls = long_polls
        long_polls.on_wake = self._ready_here

    async def start(self) -> None:
        """Listen for the other shards' calls (`links/` made this user's
        alone, whatever mode it had: docs/internals.md, "Shards")."""
        make_dir(self._links_dir)
        os.chmod(self._links_dir, DIR_MODE)
        self._server = await link.listen(link.socket_path(self._links_dir, self.index), self.serve, self._lost)

    async def open(self) -> None:
        """Serve the other shards' calls, dial each of them -- waiting until
        every one answers: the node's shards start together, and one that
        does not come up stops the node (broker.shards.supervisor) -- tell
        them the heads recovery found READY here, then keep the links up
        (a lost one dialled again) and the rates' shares moving until `close`."""
        await self.start()
        waited_s = 0.0
        while self.down():
            await self.connect_all()
            if self.down():
                await asyncio.sleep(LINK_RETRY_S)
                waited_s += LINK_RETRY_S
                if waited_s % 5 < LINK_RETRY_S:
                    log.info("waiting for shard(s) %s of the node to come up", self.down())
        self.announce_all()
        self._tasks = [asyncio.create_task(self._keep_linked(), name="shard-links"),
                       asyncio.create_task(self.rates.run(), name="shard-rates")]

    async def _keep_linked(self) -> None:
        while True:
            if self.down():
                await self.connect_all()
            await asyncio.sleep(LINK_RETRY_S)

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)
        await self.stop()

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
        # and the heads this one has of the topics it was told of
        for drained in self._drained.values():
            drained.discard(shard)
        self._forget(shard)
        hello = self.peers[shard].call("hello", [self.index])
        asyncio.ensure_future(hello).add_done_callback(_ignore_outcome)
        self._tell_again(shard)
        if self.on_connected is not None:
            self.on_connected(shard)

    def _forget(self, shard: int) -> None:
        """What `shard` said of its heads: unknown again (it may have restarted, its numbers from 1)."""
        for key in [key for key in self._heads if key[0] == shard]:
            del self._heads[key]
        for key in [key for key in self._heard_numbers if key[0] == shard]:
            del self._heard_numbers[key]

    def _tell_again(self, shard: int) -> None:
        """`shard` is told again the heads of the topics it was told of (what it heard may be lost)."""
        topics = [key[1] for key in self._told if key[0] == shard]
        for topic in topics:
            del self._told[(shard, topic)]
        if self._backend is not None:
            for topic in topics:
                self._tell_head(topic)

    def announce_all(self) -> None:
        """Tell the others the head of every topic with a READY message here
        (at start: what recovery made READY woke no one)."""
        for topic in self.backend.topic_list():
            self._ready_here(topic)

    def heard_head(self, shard: int, topic: str, said: Sequence[Any]) -> None:
        """`shard`'s head of `topic` now, as it said (a pull's answer, a
        notice, a tell), unless it said a newer one already."""
        key = (shard, topic)
        number = int(said[0])
        if number < self._heard_numbers.get(key, 0):
            return
        self._heard_numbers[key] = number
        head = _head_of(said)
        if head is not None:
            self._heads[(shard, topic)] = head
        else:
            self._heads.pop((shard, topic), None)

    def head_of(self, shard: int, topic: str) -> Head | None:
        """The head `shard` last said it has of `topic` (None: none said)."""
        return self._heads.get((shard, topic))

    def _tell_head(self, topic: str, answered: int | None = None) -> Head | None:
        """This shard's head of `topic`: told each other shard whose last
        told it betters (a higher priority, or an earlier trigger time), the
        shard `answered` by a pull's answer that says it. One told more than
        there is learns the rest from its next pull here."""
        head = self.backend.best_head(topic)
        told = self._told
        for shard, peer in self.peers.items():
            key = (shard, topic)
            if shard == answered:
                if head is None:
                    told.pop(key, None)
                else:
                    told[key] = head
            elif _betters(head, told.get(key)):
                assert head is not None
                told[key] = head
                asyncio.ensure_future(peer.call("best", [topic, self.index, self.say(head)])).add_done_callback(
                    _ignore_outcome)
        return head

    def say(self, head: Head | None) -> list[int]:
        """A head as said to another shard: numbered (`heard_head`)."""
        number = next(self._sayings)
        return [number] if head is None else [number, head[0], head[1]]

    def _hello(self, shard: int) -> None:
        """Shard `shard` dialled this one, having (re)started: it is dialled
        back now, so that a call forwarded to it does not meet the backoff
        of a dial that failed while it was down (a 503 to a client)."""
        peer = self.peers.get(shard)
        self._forget(shard)  # (what it says from now on, numbered from 1 if it restarted, follows this hello)
        self._tell_again(shard)
        if peer is not None and not peer.up:
            peer.heard_from()
            asyncio.ensure_future(peer.connect()).add_done_callback(_ignore_outcome)

    def _lost(self, connection: link.Connection) -> None:
        for watchers in self._watchers.values():
            watchers.pop(connection, None)

    def _hear(self, op: str, args: Sequence[Any]) -> None:
        if op == "ready":
            topic, shard, head = args
            self._notices[(shard, topic)] = self._notices.get((shard, topic), 0) + 1
            self.heard_head(shard, topic, head)
            self._has_ready(shard, topic)

    def _has_ready(self, shard: int, topic: str) -> None:
        """`shard` said it has a READY message of `topic`: pulls ask it again, and long polls here pull."""
        for (drained_topic, _), drained in self._drained.items():
            if drained_topic == topic:
                drained.discard(shard)
        if self._long_polls is not None:
            self._long_polls.wake_waiters(topic)

    def _ready_here(self, topic: str) -> None:
        """A message became READY here (LongPolls.wake): the shards that
        found none are told, with the head; the others if it betters what
        they were told."""
        if self._backend is None:
            return
        watchers = self._watchers.pop(topic, None)
        if watchers:
            head = self.backend.best_head(topic)
            for connection, shard in watchers.items():
                connection.notify("ready", [topic, self.index, self.say(head)])
                if head is None:  # (as it hears it: nothing said, so the next head is told)
                    self._told.pop((shard, topic), None)
                else:
                    self._told[(shard, topic)] = head
        self._tell_head(topic)

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
        topic, shard = str(args[0]), int(args[1])
        self.heard_head(shard, topic, args[2])
        self._has_ready(shard, topic)

    async def _on_pull(self, args: Sequence[Any], connection: link.Connection) -> list[Any]:
        """This shard's best READY messages; if fewer than asked, the asker is
        told when one is READY here; the head left, as `_tell_head`."""
        self.served += 1
        request: PullRequest | LongPollRequest = PullRequest(*args[0]) if len(args[0]) == 4 \
            else LongPollRequest(*args[0])
        asker = int(args[1])
        pulled = await self.backend.requests.pull(request)
        if len(pulled) < request.batch:
            self._watchers[request.topic][connection] = asker
        head = self._tell_head(request.topic, asker)
        return [[message_fields(m) for m in pulled], self.say(head)]

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
        return dataclasses.replace(command, handler=handler, inline=False, batch=None)

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
        if command.where.merge in CODE_ONLY_MERGES and succeeded(response):
            response = SUCCESS_ONLY  # (the asker's merge reads its code alone)
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


async def _fenced(b: Broker, a: Sequence[Any]) -> Any:
    return fencings_fields(await b.requests.fenced(fenced_of(a)))


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


async def _export_msgs(b: Broker, a: Sequence[Any]) -> Any:
    page, cursor = await b.export_msgs(a[0], frozenset(Status(s) for s in a[1]), a[2], a[3])
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
    return b.metrics.recent_monitor_data()


ENGINE_OPS: dict[str, Callable[[Broker, Sequence[Any]], Awaitable[Any]]] = {
    "send": _send, "give_back": _give_back, "retry_at": _retry_at, "ack_many": _ack_many, "fenced": _fenced,
    "get": _get,
    "delete": _delete, "reschedule": _reschedule, "redrive": _redrive, "redrive_all": _redrive_all,
    "list_dead": _list_dead, "export_msgs": _export_msgs, "list_msgs": _list_msgs, "count_msgs": _count_msgs, "delete_msgs": _delete_msgs,
    "reschedule_msgs": _reschedule_msgs, "topic_list": _topic_list, "topic_infos": _topic_infos,
    "topic_backlogs": _topic_backlogs, "monitor_data": _monitor_data}

# The link's own calls: a shard's hello and best priority, a pull (it watches for the asker), a
# command forwarded whole, a report of rates to shard 0.
LINK_OPS: dict[str, Callable[[ShardRouter, Sequence[Any], link.Connection], Awaitable[Any]]] = {
    "hello": ShardRouter._on_hello, "best": ShardRouter._on_best, "pull": ShardRouter._on_pull,
    "call": ShardRouter._on_call, "rates": ShardRouter._on_rates}
