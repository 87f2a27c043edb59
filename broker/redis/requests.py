"""The Redis backend's requests: send, pull and long poll, ack and nack,
fenced acks, nacks and extensions (docs/api.md, "Leases"), delete, get,
reschedule, dead letters and topic info, each ONE Lua script
over one topic's keys (broker/redis/lua/backend/), so Redis runs it
atomically and several hourglass processes may share one Redis.

`RedisRequests` is a part of `broker.redis.backend.RedisBroker`, which
holds the tasks (the mover and the wake listener); the requests reach
Redis through the `broker.redis.link.RedisLink` it hands them.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Callable, Sequence

from storage.entry import Message, Status
from storage.errors import Conflict, InvalidRequest, NotFound
from storage.store import NewMessage
from wheel.clock import Clock

from ..backend import DEAD_SCAN, REDRIVE_STEP, WAITING_BUCKETS, topic_info_json
from ..core.bulk_params import DeadFilter, JobCursor
from ..core.leases import delivery_id, handed_over_ms, new_delivery
from ..core.lifecycle import Lifecycle
from ..core.params import (
    AckRequest,
    DeleteRequest,
    Fenced,
    FencedRequest,
    LongPollRequest,
    NewSend,
    PullRequest,
    as_sends,
)
from ..core.release_rate import ReleaseRate, smoothing_ms
from ..core.transitions import Fencing, Refusal
from ..observe.metrics import Backlog, Metrics, due_ms
from .keys import NO_LOCATION, message_of, ready_member
from .link import RedisLink, made_ready
from .scripts import Reply

# Dead-set members a redriveMsgs job's slice reads at most (a script of
# about a millisecond: each is a HGET and a JSON decode).
JOB_SCAN = 1000
# Topics whose queue sizes one pipelined round trip reads (topic_backlogs).
BACKLOG_SLICE = 500


class SendOutcome(enum.StrEnum):
    """The send script's answer for one message (lua/backend/send.lua), as
    the string Redis returns; the values are the script's, kept on the wire:

        DUPLICATE  "0"  the id holds a message (a live one, or an ended one
                        and the send is strict): the stored message follows,
                        unchanged
        WAITING    "1"  stored; its trigger time is not reached
        READY      "2"  stored already due: in the ready queue at once
        EXPIRED    "5"  stored already past its ttl: ended, never delivered
                        (or an import's dead one, expired)
        ENDED      "6"  an import's dead one (importMsgBatch), stored ended

    The last four are the new message's `Status`."""

    DUPLICATE = "0"
    WAITING = "1"
    READY = "2"
    EXPIRED = "5"
    ENDED = "6"


def _woke(result: Reply) -> tuple[Reply, bool]:
    """A script's answer without its '+' (lua/backend/common.lua's woke:
    a parked keyed message became pullable, so the caller wakes the topic's
    long polls), and whether it had one."""
    if isinstance(result, str) and result.endswith("+"):
        return result[:-1], True
    return result, False


def _message(topic: str, msg_id: str, meta: str, body: str) -> Message:
    return message_of(topic, msg_id, json.loads(meta), body)


class RedisRequests:
    """The message requests over a `RedisLink`: each checks that the
    backend serves (`lifecycle`), runs its script, counts what it did in
    `metrics` and wakes who must know (the long polls of every process,
    the mover here). RedisBroker builds it and binds its methods as its own
    (broker.backend.Backend); the API calls it directly."""

    def __init__(self, link: RedisLink, clock: Clock, metrics: Metrics, lifecycle: Lifecycle) -> None:
        self._link = link
        self._clock = clock
        self._metrics = metrics
        self._lifecycle = lifecycle
        # what every request uses of the link, looked up once
        self._config = link.config
        self._state = link.state
        self._script = link.script
        self._publish = link.publish
        # Topic settings this node carries out itself (broker.redis.flow;
        # set by the keeper's `set_flow` and `set_dedup_window`): a release
        # rate's bucket (this node's own), a due-age cap, a dedup window.
        self._rates: dict[str, ReleaseRate] = {}
        self._rate_wakes: set[str] = set()
        self._max_due_age_ms: dict[str, int] = {}
        self._dedup_window_ms: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"RedisRequests({self._link!r})"

    async def send(self, sends: Sequence[NewSend | NewMessage], now_ms: int | None = None) -> list[Message]:
        """Store new messages (a duplicate id of a live message, also earlier
        in the batch, answers the stored message, unchanged; an ended one is
        replaced unless the send is strict). One atomic script per topic. A
        message due already is answered READY (or EXPIRED), as it is stored.
        `now_ms`: the time they are stored at (None: the clock's now)."""
        self._lifecycle.check_serving()
        if not sends:
            return []
        sends = as_sends(sends)
        batch = [s.message for s in sends]
        if now_ms is None:
            now_ms = self._clock.now_ms()
        new_topics = {n.topic for n in batch} - self._state.registered
        if new_topics:
            await self._link.register(new_topics)  # LimitReached past --max-topics: nothing stored
            self._state.registered |= new_topics
            self._state.topics |= new_topics
        by_topic: dict[str, list[int]] = defaultdict(list)
        for i, n in enumerate(batch):
            by_topic[n.topic].append(i)
        out: dict[int, Message] = {}  # by position in the batch
        for topic, positions in by_topic.items():
            for i, message in zip(positions, await self._send_topic(topic, [sends[i] for i in positions], now_ms)):
                out[i] = message
        return [out[i] for i in range(len(batch))]

    def set_flow(self, topic: str, release_per_s: float, max_due_age_ms: int) -> None:
        """The topic's release rate (a second, 0: none) and due-age cap (0: none) from now on."""
        rate = self._rates.get(topic)
        if release_per_s <= 0:
            self._rates.pop(topic, None)
        elif rate is None or rate.per_s != release_per_s:
            self._rates[topic] = ReleaseRate(release_per_s, self._clock.now_ms())
        if max_due_age_ms > 0:
            self._max_due_age_ms[topic] = max_due_age_ms
        else:
            self._max_due_age_ms.pop(topic, None)

    def set_dedup_window(self, topic: str, window_ms: int) -> None:
        if window_ms > 0:
            self._dedup_window_ms[topic] = window_ms
        else:
            self._dedup_window_ms.pop(topic, None)

    async def _send_topic(self, topic: str, sends: list[NewSend], now_ms: int) -> list[Message]:
        # dedupWindowMillis: an id whose message ended within the window (its
        # purge time in `retire` at or after now - window + retention) answers
        # the ended message, as a strict send does
        window_ms = self._dedup_window_ms.get(topic, 0)
        dedup_from = str(now_ms - window_ms + self._config.retention_ms) if window_ms else ""
        args = [str(now_ms), str(now_ms + self._config.retention_ms), dedup_from]
        batch = []
        retries: dict[str, int] = {}  # an import's kept retry count (NewSend.kept)
        for n, is_strict, skip_after_ms, run, _, kept in sends:
            batch.append(n)
            if kept is not None:
                retries[n.msg_id] = kept[1]
            args += [n.msg_id, n.msg, str(n.produce_ms), str(n.trigger_ms), str(n.ttl_ms),
                     str(n.trigger_ms + n.ttl_ms), str(n.max_retry), str(n.priority), n.tag,
                     ready_member(n.priority, n.trigger_ms, n.msg_id), "1" if is_strict else "0", n.key,
                     n.traceparent, n.tracestate, run_mark(skip_after_ms, run),
                     n.fair_key, "0" if kept is None else str(kept[1]),
                     "" if kept is None or kept[0] == Status.WAITING else str(kept[0])]
        results = await self._script("send", topic, args)
        m = self._metrics.topic(topic)
        out, ready = [], []
        answered: dict[str, Message] = {}  # a duplicate of an earlier item gets that item's answer
        for n, (state, *stored) in zip(batch, results):
            if state == SendOutcome.DUPLICATE:
                m.duplicates += 1
                out.append(answered.get(n.msg_id) or _message(topic, n.msg_id, *stored))
                continue
            m.sends += 1
            out.append(Message(*n[:9], status=Status(int(state)), retry=retries.get(n.msg_id, 0), location=NO_LOCATION,
                               key=n.key,
                               traceparent=n.traceparent, tracestate=n.tracestate, fair_key=n.fair_key))
            answered[n.msg_id] = out[-1]
            if state == SendOutcome.READY:
                ready.append(due_ms(n.trigger_ms, n.produce_ms))
            elif state in (SendOutcome.EXPIRED, SendOutcome.ENDED):
                m.ended += 1
            elif n.trigger_ms < self._state.next_due_ms:
                self._state.mover_wake.set()
        made_ready(self._metrics, topic, ready, now_ms)
        if ready:
            await self._publish(topic)
        return out

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING."""
        return (await self._pull(request))[0]

    async def _pull(self, request: PullRequest | LongPollRequest) -> tuple[list[Message], str]:
        """The pulled messages and their ack deadline. A pusher's poll
        (`push_timeout_ms`) files them as this node's deliveries, handed back
        once that timeout has passed if this node is gone by then."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        deadline = str(now_ms + request.ack_timeout_ms)
        batch = request.batch
        rate = self._rates.get(request.topic)
        held_since_ms = None
        if rate is not None:  # this node's bucket of the topic's releaseRate
            held_since_ms = rate.held_since_ms  # (before this pull's take)
            batch = min(batch, rate.available(now_ms))
            if not batch:  # (held back, if anything is due: unknown without a script, taken as so)
                rate.took(0, True, now_ms)
                self._wake_at_token(request.topic, rate, now_ms)
                return [], deadline
        cap_ms = self._max_due_age_ms.get(request.topic)
        push_ms = request.push_timeout_ms if isinstance(request, LongPollRequest) else 0
        held = ([self._state.node, str(now_ms + push_ms), str(now_ms + self._config.lease_ms)] if push_ms
                else ["", "", ""])
        delivery = new_delivery(now_ms)
        ended, *rows = await self._script("pull", request.topic, [
            str(now_ms), deadline, str(batch), str(now_ms + self._config.retention_ms), *held,
            "" if cap_ms is None else str(now_ms - cap_ms), delivery_id(delivery), *request.tags])
        messages = [_message(request.topic, *row)._replace(delivery=delivery) for row in rows]
        if rate is not None:
            limited = len(messages) == batch < request.batch
            rate.took(len(messages), limited, now_ms)
            if limited:
                self._wake_at_token(request.topic, rate, now_ms)
            for message in messages:  # the lateness the rate added, apart (as broker.disk.messages counts it)
                due = due_ms(message.trigger_ms, message.produce_ms)
                smoothing = smoothing_ms(due, held_since_ms, now_ms)
                self._metrics.observe_release(request.topic, max(0, now_ms - due) - smoothing, smoothing)
        m = self._metrics.topic(request.topic, exists=bool(messages) or request.topic in self._state.topics)
        m.ended += ended
        m.pulled(messages, now_ms)
        return messages, deadline

    def _wake_at_token(self, topic: str, rate: ReleaseRate, now_ms: int) -> None:
        """The topic's bucket held due messages back: this node's long polls
        of it pull again when the next token is there (one timer a topic)."""
        if topic in self._rate_wakes:
            return
        self._rate_wakes.add(topic)

        def wake() -> None:
            self._rate_wakes.discard(topic)
            self._link.long_polls.wake(topic)
        self._clock.call_later(rate.next_token_ms(now_ms) / 1000, wake)

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY,
        woken by the topic's wake channel (and pulling again every poll_ms
        in case a wake was lost with a connection). `gone()` says the client hung up:
        then nothing is taken, and what was taken meanwhile goes back to
        READY with its retry unchanged (as the disk broker does)."""
        ack_deadline = ""

        async def pull() -> list[Message]:
            nonlocal ack_deadline
            messages, ack_deadline = await self._pull(request)
            return messages

        async def give_back(messages: list[Message]) -> None:
            await self._give_back(request.topic, messages, ack_deadline)

        # the waiter set before each pull: another process's wake meanwhile counts
        return await self._link.long_polls.wait_ready(request.topic, request.long_polling_timeout_ms, pull, give_back,
                                                gone, wait_before_pull=True, repoll_s=self._config.poll_ms / 1000)

    async def _give_back(self, topic: str, messages: list[Message], ack_deadline: str) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        if await self._script("give_back", topic, [ack_deadline, *(m.msg_id for m in messages)]):
            await self._publish(topic)

    async def ack(self, request: AckRequest) -> None:
        """ack: WAITING, READY or CONSUMING -> ACKED. nack: CONSUMING ->
        READY, or ENDED after its last delivery. Anything else (an unknown
        id, an ended message, a nack of one not consuming) changes nothing
        and is no error, as camellia."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        result, woke = _woke(await self._script("ack", request.topic, [
            request.msg_id, "1" if request.ack else "0", str(now_ms), str(now_ms + self._config.retention_ms)]))
        if result in ("NF", "NOOP"):
            return
        m = self._metrics.topic(request.topic)
        if request.ack:
            m.acks += 1
            if isinstance(result, str) and result.startswith("OK "):  # due: it dwelt since its trigger time
                self._metrics.acked((int(result[3:]),), now_ms)
        else:
            m.nacks += 1
            if result == "READY":
                m.retries += 1
            else:
                m.ended += 1
        if result == "READY" or woke:  # a nack's message, or its key's next one, is pullable
            await self._publish(request.topic)

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        """As the disk broker's: a failed push delivery's CONSUMING message
        leaves flight and waits (WAITING) until `at_ms`, its trigger time
        then (expire and rank as rescheduleMsg computes them), or ENDED as a
        nack would end it; anything else changes nothing. One script."""
        self._lifecycle.check_serving()
        found = await self._script("get", topic, [msg_id])
        if not found:
            return None
        old = _message(topic, msg_id, *found)
        now_ms = self._clock.now_ms()
        at_ms = max(at_ms, now_ms)
        result, woke = _woke(await self._script("retry_at", topic, [
            msg_id, str(at_ms), str(at_ms + old.ttl_ms), ready_member(old.priority, at_ms, msg_id),
            str(now_ms + self._config.retention_ms)]))
        if result in ("NF", "NOOP"):
            return None
        if woke:  # its key's next message is pullable
            await self._publish(topic)
        m = self._metrics.topic(topic)
        m.nacks += 1
        if result == "ENDED":
            m.ended += 1
            return Status.ENDED
        m.retries += 1
        if at_ms < self._state.next_due_ms:
            self._state.mover_wake.set()
        return Status.WAITING

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id in turn (a script each, then a read of its
        status); the status of each after it (None: no such message)."""
        after: dict[str, Status | None] = {}
        for msg_id in msg_ids:
            if msg_id not in after:  # a repeated id: once
                await self.ack(AckRequest(topic, msg_id, ack))
                found = await self._script("get", topic, [msg_id])
                after[msg_id] = _message(topic, msg_id, *found).status if found else None
        return [after[msg_id] for msg_id in msg_ids]

    async def fenced(self, request: FencedRequest) -> list[Fencing]:
        """A fenced ack, nack or extension of each id (docs/api.md, "Leases"),
        as the disk broker's: one script for all (lease.lua), each id
        carried out only while its delivery is the current one (a repeated
        id once, by its first delivery); each one's outcome."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        first: dict[str, int] = {}
        for msg_id, delivery in zip(request.msg_ids, request.deliveries):
            first.setdefault(msg_id, delivery)
        args = [request.kind.value, str(now_ms), str(now_ms + self._config.retention_ms),
                str(now_ms + request.ack_timeout_ms)]
        for msg_id, delivery in first.items():
            args += [msg_id, delivery_id(delivery), str(handed_over_ms(delivery) + request.max_lease_ms)]
        answers = await self._script("lease", request.topic, args)
        woke = bool(answers) and answers[-1] == "+"
        outcomes: dict[str, Fencing] = {}
        # (a message found: its topic exists, if another node registered it since this one's mover looked)
        m = self._metrics.topic(request.topic, exists=request.topic in self._state.topics
                                or any(answer != "NF" for answer in answers))
        requeued = extended = False
        for msg_id, answer in zip(first, answers):
            if answer == "NF":
                outcomes[msg_id] = Fencing(None, Refusal.STALE)
                m.stale += 1
            elif answer == "CAP":
                outcomes[msg_id] = Fencing(Status.CONSUMING, Refusal.LEASE_CAP)
            elif answer.startswith("STALE "):
                outcomes[msg_id] = Fencing(Status(int(answer[6:])), Refusal.STALE)
                m.stale += 1
            else:
                _, status, trigger = answer.split(" ")
                after = Status(int(status))
                outcomes[msg_id] = Fencing(after, None, now_ms + request.ack_timeout_ms
                                           if request.kind is Fenced.EXTEND else 0)
                if request.kind is Fenced.EXTEND:
                    m.extensions += 1
                    extended = True
                elif request.kind is Fenced.ACK:
                    m.acks += 1
                    self._metrics.acked((int(trigger),), now_ms)
                else:
                    m.nacks += 1
                    if after is Status.READY:
                        m.retries += 1
                        requeued = True
                    else:
                        m.ended += 1
        if requeued or woke:  # a nack's message, or a key's next one, is pullable
            await self._publish(request.topic)
        if extended and now_ms + request.ack_timeout_ms < self._state.next_due_ms:
            self._state.mover_wake.set()  # (a shorter lease: its timeout before the mover meant to wake)
        return [outcomes[msg_id] for msg_id in request.msg_ids]

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the
        id. An ended or unknown message raises NotFound (camellia's 404);
        with `release` an ended one is released all the same."""
        self._lifecycle.check_serving()
        result, woke = _woke(await self._script("delete", request.topic, [
            request.msg_id, "1" if request.release else "0", str(self._clock.now_ms() + self._config.retention_ms)]))
        if result == "NF":
            raise NotFound(f"no message {request.msg_id!r} in topic {request.topic!r}")
        if result == "NOOP":
            raise NotFound(f"message {request.msg_id!r} has ended")
        if result == "OK":
            self._metrics.topic(request.topic).deletes += 1
        if woke:  # a consuming message's key is free: its next message is pullable
            await self._publish(request.topic)

    async def get(self, topic: str, msg_id: str) -> Message:
        self._lifecycle.check_serving()
        found = await self._script("get", topic, [msg_id])
        self._metrics.topic(topic, exists=bool(found) or topic in self._state.topics).gets += 1
        if not found:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        return _message(topic, msg_id, *found)

    # == reschedule and dead letters ================================================

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """As the disk broker's: a WAITING or READY message gets a new
        trigger time (<= now: READY at once); else Conflict."""
        self._lifecycle.check_serving()
        old = await self.get(topic, msg_id)
        now_ms = self._clock.now_ms()
        result = await self._script("reschedule", topic, [
            msg_id, str(trigger_ms), str(trigger_ms + old.ttl_ms), ready_member(old.priority, trigger_ms, msg_id),
            str(now_ms), str(now_ms + self._config.retention_ms)])
        message = self._changed(topic, msg_id, result, "rescheduled", "only a waiting or ready message")
        self._metrics.topic(topic).reschedules += 1
        if message.status is Status.READY:
            made_ready(self._metrics, topic, [due_ms(trigger_ms, now_ms)], now_ms)
            await self._publish(topic)
        elif message.status is Status.EXPIRED:  # a schedule's run of misfire=skip moved past its grace
            self._metrics.topic(topic).ended += 1
        elif trigger_ms < self._state.next_due_ms:
            self._state.mover_wake.set()
        return message

    def _changed(self, topic: str, msg_id: str, result: Reply, verb: str, allowed: str) -> Message:
        if result == "NF":
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        if isinstance(result, str) and result.startswith("S"):
            status = Status(int(result[1:]))
            hint = " (ack or nack it first)" if status is Status.CONSUMING else ""
            raise Conflict(f"message {msg_id!r} is {status.name.lower()} (status {int(status)}): {allowed} "
                           f"can be {verb}{hint}")
        return _message(topic, msg_id, *result)

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters, in the order they are purged
        (oldest ended first), reading at most DEAD_SCAN members; the cursor
        ("<purge ms>:<msgId>") of the next page, or None."""
        self._lifecycle.check_serving()
        score, _, after_id = (cursor or "").partition(":")
        if cursor and not (score.isascii() and score.isdigit() and after_id):
            raise InvalidRequest("cursor", f"must be a cursor a listDeadMsg page answered, got {cursor[:40]!r}")
        wanted = "," + ",".join(str(int(s)) for s in sorted(statuses)) + ","
        next_score, next_id, *rows = await self._script("dead", topic, [score, after_id, str(limit),
                                                                        str(DEAD_SCAN), wanted])
        messages = [_message(topic, rows[i], rows[i + 1], rows[i + 2]) for i in range(0, len(rows), 3)]
        return messages, None if not next_score else f"{int(float(next_score))}:{next_id}"

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter READY again now with retry 0 and its ttl from now."""
        self._lifecycle.check_serving()
        old = await self.get(topic, msg_id)
        result, = await self._redrive(topic, [old])
        message = self._changed(topic, msg_id, result, "re-driven", "only an expired (5) or ended (6) message")
        return message

    async def _redrive(self, topic: str, olds: list[Message]) -> list[Reply]:
        now_ms = self._clock.now_ms()
        args = [str(now_ms)]
        for m in olds:
            args += [m.msg_id, str(now_ms + m.ttl_ms), ready_member(m.priority, now_ms, m.msg_id)]
        results: list[Reply] = await self._script("redrive", topic, args)
        done = sum(1 for r in results if not isinstance(r, str))
        if done:
            self._metrics.topic(topic).redrives += done
            made_ready(self._metrics, topic, [now_ms] * done, now_ms)
            await self._publish(topic)
        return results

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """The topic's dead letters, oldest first, at most `limit`, a page of
        REDRIVE_STEP a script; how many, and whether more are left."""
        self._lifecycle.check_serving()
        done, cursor = 0, None
        dead = frozenset((Status.EXPIRED, Status.ENDED))
        while done < limit:
            page, cursor = await self.list_dead(topic, dead, cursor, min(REDRIVE_STEP, limit - done))
            if page:
                results = await self._redrive(topic, page)
                done += sum(1 for r in results if not isinstance(r, str))
            if cursor is None:
                return done, False
        more, _ = await self.list_dead(topic, dead, cursor, 1)
        return done, bool(more)

    async def redrive_slice(self, topic: str, flt: DeadFilter, trigger_ms: int | None, cursor: JobCursor,
                            max_moves: int) -> tuple[int, int, JobCursor | None, None]:
        """One slice of a redriveMsgs job (broker.jobs.runner), one script
        (lua/backend/redrive_slice.lua): the topic's dead letters in purge
        order after `cursor` ((purge ms, msgId); (0, 0): the start), at most
        JOB_SCAN read and `max_moves` matches of `flt` put back, WAITING at
        `trigger_ms` (None: READY now) with retry 0 and their redriveCount
        one more. (matched, re-driven, the cursor of the next slice or None:
        the scan is over, None: durable on return as Redis keeps what it is
        told). Atomic: a match is re-driven in the script that finds it, so
        none is skipped, and a moved message has left the dead set: the
        slice run again (a crash before the job saved its cursor) passes it."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        score, after_id = ("", "") if isinstance(cursor[1], int) else (str(cursor[0]), cursor[1])
        wanted = "," + ",".join(str(int(s)) for s in sorted(flt.statuses)) + ","
        matched, redriven, ready, next_score, next_id = await self._script("redrive_slice", topic, [
            str(now_ms), "" if trigger_ms is None else str(trigger_ms), score, after_id, str(max_moves),
            str(JOB_SCAN), wanted, *("" if v is None else "=" + v for v in (flt.key, flt.tag, flt.msg_id_prefix)),
            *("" if v is None else str(v) for v in (flt.ended_from_ms, flt.ended_to_ms))])
        if redriven:
            self._metrics.topic(topic).redrives += redriven
            if ready:
                made_ready(self._metrics, topic, [now_ms] * ready, now_ms)
                await self._publish(topic)
            if trigger_ms is not None and trigger_ms < self._state.next_due_ms:
                self._state.mover_wake.set()
        after = None if not next_score else (int(float(next_score)), str(next_id))
        return int(matched), int(redriven), after, None

    # == topic information =======================================================

    async def topic_info(self, topic: str) -> dict[str, object]:
        """camellia's TopicInfo: zset sizes, waiting split into delay buckets;
        `oldestDueAgeMillis` from the first READY member of each priority
        (lua/backend/info.lua: docs/redis.md says what it leaves out);
        `paused` as Redis keeps it (broker.redis.flow), whichever node paused it."""
        now_ms = self._clock.now_ms()
        bounds = [str(now_ms + upper) for _, upper in WAITING_BUCKETS if upper is not None]
        waiting, ready, consuming, *buckets, oldest, due, paused = await self._script(
            "info", topic, [str(now_ms), *bounds])
        info = topic_info_json(topic, waiting, buckets, ready, consuming, int(oldest) if oldest else None, now_ms)
        info["dueUndelivered"] = ready + due  # (due: WAITING ones the mover has not moved yet)
        info["paused"] = paused == 1 or (sorted(paused) if paused else False)
        return info

    async def topic_infos(self, topics: Sequence[str]) -> list[dict[str, object]]:
        """`topic_info` of each of `topics` (a script each: Redis counts by score)."""
        return [await self.topic_info(topic) for topic in topics]

    def topic_list(self) -> list[str]:
        """Topics known to this process (its sends, and the topic set as the
        mover last read it)."""
        return sorted(self._state.topics)

    async def topic_backlogs(self) -> dict[str, Backlog]:
        """(waiting, ready, consuming, None) of every topic `topic_list`
        knows: three ZCARDs a topic, BACKLOG_SLICE topics a pipelined round
        trip (the loop serves other requests while it is away). The dead
        letters are not counted: they share the `retire` zset with the
        acked and deleted messages, and only a scan would tell them apart."""
        topics = list(self._state.topics)
        out: dict[str, Backlog] = {}
        for start in range(0, len(topics), BACKLOG_SLICE):
            chunk = topics[start:start + BACKLOG_SLICE]
            sizes = await self._link.zcards([key for topic in chunk for key in self._link.keys(topic).sizes])
            for i, topic in enumerate(chunk):
                out[topic] = (sizes[3 * i], sizes[3 * i + 1], sizes[3 * i + 2], None)
        return out


def run_mark(skip_after_ms: int | None, run: bool) -> str:
    """send.lua's `skip` argument: a run of misfire=skip's deadline, "r" a
    schedule's other run, "" a message of no schedule."""
    if skip_after_ms is not None:
        return str(skip_after_ms)
    return "r" if run else ""
