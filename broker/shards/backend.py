"""The node's Backend on a shard of many (docs/internals.md, "Shards").

`ShardedBackend` is what the API (broker.http.api) serves with when the
node runs N > 1 shards: the requests it parsed and validated, whole, go
either to this shard's own engine or, parsed, to the owner's over its link
(broker.shards.router, broker.shards.link); nothing is parsed or validated
twice.

    send, sendMsgBatch   each message to its owner (broker.shards.placement):
                         a send without a msgId gets one this shard owns,
                         so it is stored here; a batch is split by owner,
                         the parts stored at once, answered in the batch's order
    ack, get, delete,    to the msgId's owner; a NotFound there (for an ack:
    reschedule, redrive  no such message) asks the others (a keyed message
                         lives on its key's shard)
    ackMsg msgIds,       split by owner, the statuses in the ids' order; the
    fenced calls         ids an owner has no message of asked of the others
    pull, long poll      the node's best first (ShardedRequests.pull); never
                         early: a shard hands over only its READY ones; a
                         shard that had fewer than asked is skipped until it
                         tells this one the topic has one READY again, which
                         also wakes this shard's long polls
    the node's views     topic infos, getMonitorData, listMsg (one cursor:
                         the pages merged in (trigger time, msgId) order),
                         listDeadMsg (one cursor: shard by shard), bulk
                         calls: every shard's, merged (broker.shards.views)
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from storage.entry import Fields, Message, Status
from storage.errors import BodyTooLarge, HourglassError, InvalidRequest, LimitReached, NotFound, Unavailable
from storage.store import NewMessage
from wheel.clock import Clock

from ..backend import MessageRequests, topic_cap_error
from ..core.bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, RescheduleMsgsRequest
from ..core.params import AckRequest, Defaults, DeleteRequest, FencedRequest, LongPollRequest, NewSend, PullRequest
from ..core.transitions import Fencing
from ..disk.backend import Broker
from ..observe.metrics import Backlog, Metrics
from . import placement
from .router import Head, ShardRouter, outranks
from .views import (
    fenced_fields,
    fencings_of,
    filter_fields,
    list_fields,
    merge_monitor_data,
    merge_pages,
    merge_topic_infos,
    message_fields,
    message_of,
    messages_of,
    parse_walk_cursor,
    walk_cursor,
)

log = logging.getLogger("hourglass.shards")

# What a part's shard answers having stored nothing of it. Any other failure -- a link lost above
# all -- leaves the part's outcome unknown: its shard may have committed it before the answer was lost.
STORED_NOTHING = (InvalidRequest, LimitReached, BodyTooLarge)
# Take-backs kept for shards that could not be reached (a failed batch's messages: owed_back)
MAX_OWED = 100_000
# (shard, topic, msgId)
Owed = tuple[int, str, str]


def owed_back(sends: Sequence[NewSend], owners: Sequence[int], parts: dict[int, list[int]],
              answers: Sequence[object]) -> list[Owed]:
    """What a batch answered 503 takes back (docs/api.md, "Shards"), so
    the client's retry stores nothing twice: each message whose id the
    node made (the client never saw it: its retry gets new ones), in a
    part its shard stored or may have stored (`answers`, a part's each:
    its messages, or what it raised). A client's own ids are left: the
    retry's send of them finds them stored."""
    out = []
    for (shard, ats), answer in zip(parts.items(), answers):
        if isinstance(answer, STORED_NOTHING):
            continue
        out += [(shard, sends[at].message.topic, sends[at].message.msg_id) for at in ats if sends[at].made_id]
    return out


def _log_failure(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("taking back a failed batch's messages failed", exc_info=done.exception())


def _rank(said: tuple[Head | None, int]) -> tuple[int, float]:
    """A shard's place in a pull's order by its head (nothing said: as priority 0, due last)."""
    head = said[0]
    return (0, math.inf) if head is None else (-head[0], head[1])


class ShardedRequests:
    """The message requests of a node of many shards (MessageRequests):
    see the module docstring."""

    def __init__(self, router: ShardRouter, engine: Broker) -> None:
        self._router = router
        self._local = engine.requests
        self._long_polls = engine.long_polls
        self._give_back_here = engine.give_back
        self._head_here = engine.best_head
        self._has_topic = engine.has_topic
        self._topic_list = engine.topic_list
        self._max_topics = engine.limits.topics
        self._admitted: set[str] = set()  # topics the node was found to have
        self._owed: list[Owed] = []  # take-backs of failed batches, for shards not reachable then
        router.on_connected = self._shard_back

    def __repr__(self) -> str:
        return f"ShardedRequests({self._router!r})"

    async def send(self, sends: Sequence[NewSend], now_ms: int) -> list[Message]:
        router = self._router
        count, index = router.count, router.index
        if self._owed:
            down = router.down()
            for shard in {o[0] for o in self._owed if o[0] not in down}:
                self._shard_back(shard)
        topic = sends[0].message.topic if sends else ""
        if sends and topic not in self._admitted and not self._has_topic(topic):
            await self._admit_topic(topic)
        owners = [placement.message_owner(s.message.msg_id, s.message.key, count) for s in sends]
        if all(o == index for o in owners):
            return await self._local.send(sends, now_ms)
        parts: dict[int, list[int]] = defaultdict(list)
        for at, shard in enumerate(owners):
            parts[shard].append(at)
        down = [shard for shard in router.down() if shard in parts]
        if down:  # a part's shard is known down: nothing stored anywhere
            raise Unavailable(f"shard {down[0]} of the node is not up; the batch stored nothing; retry")
        calls: list[Awaitable[Any]] = []
        for shard, ats in parts.items():
            part = [sends[at] for at in ats]
            if shard == index:
                calls.append(self._local.send(part, now_ms))
            else:
                calls.append(router.call(shard, "send", [[[list(s.message), s.strict, s.skip_after_ms,
                                                             None if s.kept is None else list(s.kept)]
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
        if failed is not None:
            # a part not stored: the client sends the batch again, and its ids dedup what was stored;
            # what had no id of the client's (made here) is taken back, or the retry would store it twice
            await self._take_back(owed_back(sends, owners, parts, answers))
            raise failed
        return [m for m in stored if m is not None]

    async def _take_back(self, owed: list[Owed]) -> None:
        """Delete (releasing the id) each message a failed batch stored, or
        may have stored, under an id the node made. A shard that cannot be
        reached is owed it: taken back once that shard is connected again
        (its store then holds whatever it committed). Past MAX_OWED, and
        on any other failure, logged."""
        router = self._router
        for shard, topic, msg_id in owed:
            request = DeleteRequest(topic, msg_id, True)
            try:
                if shard == router.index:
                    await self._local.delete(request)
                else:
                    await router.call(shard, "delete", list(request))
            except NotFound:
                continue  # (never stored: that part's outcome was unknown)
            except Unavailable:
                if len(self._owed) < MAX_OWED:
                    self._owed.append((shard, topic, msg_id))
                else:
                    log.warning("a message of a batch answered 503 not taken back (%d owed already): %s on "
                                "shard %d", MAX_OWED, msg_id, shard)
            except HourglassError as e:
                log.warning("a message of a batch answered 503 not taken back: %s on shard %d: %s",
                            msg_id, shard, e)

    def _shard_back(self, shard: int) -> None:
        """A shard connected again (or up at a batch's send: one that was
        starting when it was connected is asked again): what it is owed
        taken back now."""
        mine = [o for o in self._owed if o[0] == shard]
        if not mine:
            return
        self._owed = [o for o in self._owed if o[0] != shard]
        log.info("taking back %d messages of batches answered 503 from shard %d", len(mine), shard)
        asyncio.ensure_future(self._take_back(mine)).add_done_callback(_log_failure)

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
        "Shards"). The shards are asked best first by the heads they said
        (broker.shards.router.outranks): those whose head outranks this
        one's, this one, then the others; each for the batch's room left
        and for as many as its head outranks of those taken (a shard that
        said nothing may hold priority 0). Of all taken, the batch's best
        in pull order (priority, then trigger time) are the answer; the
        rest are given back, READY again on their shards."""
        router = self._router
        topic = request.topic
        drained = router.drained(topic, request.tags)
        here = self._head_here(topic)
        others = [shard for shard in router.others() if shard not in drained]
        # the others by what they said, best first: those outranking this shard's head before it
        said = sorted(((router.head_of(shard, topic), shard) for shard in others), key=_rank)
        order: list[tuple[Head | None, int]]
        if here is None:  # none in the window, or a topic not ordered by priority here (fair, a due-age cap):
            order = [(None, router.index), *said]  # asked first all the same (its own order decides)
        else:
            order = [b for b in said if outranks(b[0], *here)]
            order += [(here, router.index)] + [b for b in said if not outranks(b[0], *here)]
        pulled: list[Message] = []
        for head, shard in order:
            want = request.batch - len(pulled) + sum(1 for m in pulled if outranks(head, m.priority, m.trigger_ms))
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
        """Up to `want` of `shard`'s best (taken there: CONSUMING); its head
        after, as its answer says, kept for the next pulls."""
        router = self._router
        heard = router.heard(shard, request.topic)
        try:
            rows, head = await router.call(shard, "pull", [list(request._replace(batch=want)), router.index])
        except Unavailable:
            return []
        router.heard_head(shard, request.topic, head)
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
        message of is asked of the others in turn (`_by_owner`)."""
        local, router = self._local, self._router

        def part(shard: int, ats: list[int]) -> Awaitable[Any]:
            ids = [msg_ids[at] for at in ats]
            return (local.ack_many(topic, ids, ack) if shard == router.index
                    else router.call(shard, "ack_many", [topic, ids, ack]))

        found = await self._by_owner(msg_ids, part, lambda status: status is not None)
        return [None if status is None else Status(status) for status in found]

    async def fenced(self, request: FencedRequest) -> list[Fencing]:
        """Each id's fenced call on its msgId's owner; an id that shard has
        no message of is asked of the others in turn (`_by_owner`)."""
        local, router = self._local, self._router
        deliveries: Fields = request.deliveries  # (by index: each int goes on as it is)

        async def elsewhere(shard: int, one: FencedRequest) -> list[Fencing]:
            return fencings_of(await router.call(shard, "fenced", fenced_fields(one)))

        def part(shard: int, ats: list[int]) -> Awaitable[list[Fencing]]:
            one = request._replace(msg_ids=tuple([request.msg_ids[at] for at in ats]),
                                   deliveries=cast(tuple[int, ...], tuple([deliveries[at] for at in ats])))
            return local.fenced(one) if shard == router.index else elsewhere(shard, one)

        found: list[Fencing] = await self._by_owner(request.msg_ids, part, lambda outcome: outcome.status is not None)
        return found

    async def _by_owner(self, msg_ids: Sequence[str], part: Callable[[int, list[int]], Awaitable[Any]],
                        found: Callable[[Any], bool]) -> list[Any]:
        """Each id's answer from its msgId's owner (`part(shard, the ids'
        places)`: its answers, in order); an id whose answer is not `found`
        there is asked of the others in turn (a keyed message lives on its
        key's shard: acked at its msgId's alone, it would be left consuming
        and delivered again after its ack timeout)."""
        router = self._router
        answers: list[Any] = [None] * len(msg_ids)
        missing = list(range(len(msg_ids)))
        first = {at: placement.owner(msg_ids[at], router.count) for at in missing}
        for turn in range(router.count):
            parts: dict[int, list[int]] = defaultdict(list)
            for at in missing:
                parts[(first[at] + turn) % router.count].append(at)
            calls = [part(shard, ats) for shard, ats in parts.items()]
            for ats, answer in zip(parts.values(), await asyncio.gather(*calls)):
                for at, one in zip(ats, answer):
                    answers[at] = one
            missing = [at for at in missing if not found(answers[at])]
            if not missing:
                break
        return answers

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
        return await self._shard_walk("list_dead", "listDeadMsg", self._local.list_dead, topic, statuses, cursor,
                                      limit)

    async def export_msgs(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                          limit: int) -> tuple[list[Message], str | None]:
        return await self._shard_walk("export_msgs", "exportMsg", self._local.export_msgs, topic, statuses, cursor,
                                      limit)

    async def _shard_walk(self, op: str, command: str,
                          local: Callable[[str, frozenset[Status], str | None, int],
                                          Awaitable[tuple[list[Message], str | None]]],
                          topic: str, statuses: frozenset[Status], cursor: str | None,
                          limit: int) -> tuple[list[Message], str | None]:
        """A walk's page (listDeadMsg, exportMsg) shard by shard: each
        shard's own walk to its end, then the next shard's; the cursor
        names the shard and its own cursor (`walk_cursor`)."""
        router = self._router
        shard, inner = parse_walk_cursor(cursor, router.count, command)
        page: list[Message] = []
        while True:
            if shard == router.index:
                got, inner = await local(topic, statuses, inner, limit - len(page))
            else:
                rows, inner = await router.call(shard, op,
                                                [topic, sorted(int(s) for s in statuses), inner, limit - len(page)])
                got = messages_of(rows)
            page.extend(got)
            if inner is not None:  # this shard has more: the next page goes on here
                return page, walk_cursor(shard, inner)
            shard += 1
            if shard == router.count:
                return page, None
            if len(page) >= limit:
                return page, walk_cursor(shard, None)

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

    async def _local_monitor_data(self) -> list[dict[str, Any]]:
        return self._local.metrics.recent_monitor_data()

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
