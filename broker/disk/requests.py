"""The disk broker's message requests: send, pull, long poll, ack and nack,
delete, get (docs/api.md, "Semantics").

Each checks the node is serving (broker.core.lifecycle), asks broker.core.transitions
what the message becomes, has the parts carry it out in RAM (the ready
windows, the wheel's filing), appends its changes as one record (broker.disk
.journal), and awaits the group commit (broker.disk.group_commit) before
answering -- except a pull on a standalone node, answered before its record
is durable (losing it is a redelivery). These are the hot paths: a batch of
sends is one append and one fsync; an ackMsg of many ids is one record.

    send       new messages WAITING (READY at once if due); a duplicate id
               answers the stored message
    pull       READY -> CONSUMING, up to the batch and the in-flight caps
    long_poll  pull, or wait (broker.core.long_polls) until the topic has READY
               messages or the timeout passes
    ack        CONSUMING/READY/WAITING -> ACKED; nack: CONSUMING -> READY
    delete     live -> DELETED; `release` frees the msgId
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Awaitable, Callable, Sequence

from storage.entry import Message, Status
from storage.errors import NotFound
from storage.store import SendOutcome, SendResult, StateChange, Store
from wheel.clock import Clock

from ..core.lifecycle import Lifecycle
from ..core.long_polls import LongPolls
from ..core.params import AckRequest, DeleteRequest, LongPollRequest, NewSend, PullRequest
from ..core.transitions import ACK, GIVE_BACK, NACK, Delete, Effect, MessageState, Refusal, Send, due, step
from ..observe.metrics import Metrics
from .filing import Filing
from .group_commit import GroupCommit
from .journal import Journal
from .releaser import Releaser
from .topics import Topics
from .windows import ReadyWindows

STORED = SendOutcome.STORED
CONSUMING = Status.CONSUMING
_TRIGGER_MS = operator.attrgetter("trigger_ms")
_MESSAGE = operator.itemgetter(0)  # a NewSend's message
_RESULT_MESSAGE = operator.itemgetter(1)  # a SendResult's message


class Requests:
    """The message requests of the disk broker. Runs on the event loop."""

    def __init__(self, store: Store, clock: Clock, metrics: Metrics, lifecycle: Lifecycle, long_polls: LongPolls,
                 journal: Journal, commits: GroupCommit, filing: Filing, windows: ReadyWindows,
                 releaser: Releaser, topics: Topics, *, pull_waits: bool) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._long_polls = long_polls
        self._journal = journal
        self._commits = commits
        self._filing = filing
        self._windows = windows
        self._releaser = releaser
        self._topics = topics
        # A pull waits for its record's fsync only in a cluster (there the
        # answer also waits for followers, as every write's).
        self._pull_waits = pull_waits

    def __repr__(self) -> str:
        return f"Requests(pull_waits={self._pull_waits})"

    async def send(self, sends: Sequence[NewSend], now_ms: int) -> list[Message]:
        """Store new messages at `now_ms`; answered once durable. An id whose
        message is alive (1-3) answers the stored message, unchanged. An id
        whose message has ended (4-7) is stored anew, the ended one released
        (as camellia does), unless the send asks for strict idempotence:
        then the stored message is answered unchanged while it is retained."""
        self._lifecycle.check_serving()
        batch = list(map(_MESSAGE, sends))
        topics = self._topics
        new_topics = None if len(batch) == 1 and batch[0].topic in topics.stored else topics.new_topics(batch)
        results = self._journal.send(batch, now_ms)
        if new_topics:
            topics.filing(new_topics)
        fresh: list[Message] = []  # the messages stored
        replace: list[int] = []  # the duplicates of ended messages to store anew
        for i, (outcome, stored) in enumerate(results):
            if outcome is STORED:
                fresh.append(stored)
            elif Effect.REPLACE in step(MessageState.of(stored), Send(MessageState.sent(batch[i]), sends[i].strict),
                                        now_ms).effects:
                replace.append(i)
        if replace:  # rare: release the ended ones, then store those sends again
            ended = {results[i].message.location: results[i].message for i in replace}
            self._journal.append([StateChange(m.location, m.status, m.retry, released=True) for m in ended.values()],
                                 now_ms)
            for i, result in zip(replace, self._journal.send([batch[i] for i in replace], now_ms)):
                results[i] = result
                if result.outcome is STORED:
                    fresh.append(result.message)
        # a new message: FILE, and DUE_NOW if due (transitions.step's Send;
        # the earliest is due if any is)
        self._filing.add_many(fresh, now_ms)
        due_now = bool(fresh) and due(min(map(_TRIGGER_MS, fresh)), now_ms)
        self._count_sends(results, len(fresh), len(results) - len(fresh))
        await self._commits.durable()
        if not due_now:
            return list(map(_RESULT_MESSAGE, results))
        return self._releaser.release_due_now(results, now_ms)

    def _count_sends(self, results: list[SendResult], stored: int, duplicates: int) -> None:
        topic = results[0].message.topic if results else ""
        for _, message in results:
            if message.topic != topic:
                topic = ""
                break
        if topic:  # sendMsgBatch: one topic, counted once
            m = self._metrics.topic(topic)
            m.sends += stored
            m.duplicates += duplicates
            return
        for outcome, message in results:
            m = self._metrics.topic(message.topic)
            if outcome is SendOutcome.STORED:
                m.sends += 1
            else:
                m.duplicates += 1

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING: fewer at
        the in-flight caps. Answered before the record is durable on a
        standalone node (a pull lost in a crash is a redelivery)."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        tags = frozenset(request.tags) if request.tags else None
        taken, changes = self._windows.take(request.topic, request.batch, tags, now_ms + request.ack_timeout_ms,
                                            now_ms)
        if not taken:
            return []
        self._journal.append(changes, now_ms)
        messages = []
        for held in taken:
            cached = held.message
            if cached is None:
                message = self._store.read_message(held.location)
                if message is not None:
                    messages.append(message)
            else:
                messages.append(cached.with_state(CONSUMING, held.state.retry))
                held.message = None
        self._metrics.topic(request.topic).pulled(messages, now_ms)
        if self._pull_waits:
            await self._commits.durable()
        else:  # synced with the next ack's commit, if one comes soon
            self._commits.kick_soon()
        return messages

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool]) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY.
        `gone()` says the client hung up: then nothing is taken, and what
        was taken meanwhile goes back to READY with its retry unchanged."""
        return await self._long_polls.wait_ready(request.topic, request.long_polling_timeout_ms,
                                                 functools.partial(self.pull, request), self.give_back, gone)

    async def give_back(self, messages: list[Message]) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        now_ms = self._clock.now_ms()
        held_at = self._windows.held
        taken = [held for m in messages if (held := held_at.get(m.location)) is not None]
        changes = self._windows.apply(GIVE_BACK, taken, now_ms)
        if changes:
            self._journal.append(changes, now_ms)
            await self._commits.durable()

    def ack(self, request: AckRequest) -> Awaitable[object]:
        """ack: WAITING, READY or CONSUMING -> ACKED (never delivered after).
        nack: CONSUMING -> READY now, or ENDED after its last delivery.
        Anything else -- an unknown id, an ended message, a nack of a
        message not consuming -- changes nothing and is no error (camellia).
        `ack_many` of the one id, its coroutine handed back to be awaited
        (no frame of its own between)."""
        return self.ack_many(request.topic, (request.msg_id,), request.ack)

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id (a repeated one once), one record and one fsync
        for all; the status of each after it (None: no such message). The
        consuming ones in one pass (broker.disk.windows' `apply`), no disk read;
        the others by their stored copies."""
        self._lifecycle.check_serving()
        now_ms = self._clock.now_ms()
        flying = self._windows.in_flight_of(topic, msg_ids)
        changes = self._windows.apply(ACK if ack else NACK, list(flying.values()), now_ms) if flying else []
        after: dict[str, Status | None] = {}
        for msg_id, held in flying.items():
            after[msg_id] = held.state.status
        if len(after) < len(msg_ids):
            for msg_id in msg_ids:
                if msg_id not in after:
                    change, after[msg_id] = self._ack_stored(topic, msg_id, ack, now_ms)
                    if change is not None:
                        changes.append(change)
        if changes:
            self._journal.append(changes, now_ms)
            await self._commits.durable()
        else:
            await self._commits.settled()  # an earlier change to them may still be in its commit, or unreplicated
        return list(map(after.__getitem__, msg_ids))

    def _ack_stored(self, topic: str, msg_id: str, ack: bool,
                    now_ms: int) -> tuple[StateChange | None, Status | None]:
        """The change an ack or nack of an id not in flight makes (None:
        none), by its stored copy, and the message's status after it (None:
        no such message)."""
        message = self._store.get(topic, msg_id)
        m = self._metrics.topic(topic, exists=message is not None)
        if message is None:
            return None, None
        if not ack:  # a nack of a message not held consuming changes nothing
            return None, message.status
        done = step(MessageState.of(message), ACK, now_ms)
        if done.state is None or not done.effects:
            return None, message.status
        self._leave(message, done.effects)
        m.count(done.effects)
        return StateChange(message.location, done.state.status, done.state.retry), done.state.status

    def _leave(self, message: Message, effects: tuple[Effect, ...]) -> None:
        """A message changed by id leaves the wheel (CANCEL) or its ready window (FORGET)."""
        if Effect.CANCEL in effects:
            self._filing.cancel(message.location)
        elif Effect.FORGET in effects:
            self._windows.forget_at(message.location)

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the id.
        An ended or unknown message raises NotFound (camellia's 404); with
        `release` an ended one is released all the same."""
        self._lifecycle.check_serving()
        message = self._store.get(request.topic, request.msg_id)
        now_ms = self._clock.now_ms()
        done = step(None if message is None else MessageState.of(message), Delete(request.release), now_ms)
        if message is None or done.state is None:
            raise not_found(request.topic, request.msg_id)
        if not done.effects:
            await self._commits.settled()
            raise NotFound(f"message {request.msg_id!r} has ended (status {int(message.status)})")
        self._leave(message, done.effects)
        self._journal.append([StateChange(message.location, done.state.status, message.retry,
                                          released=Effect.RELEASE_ID in done.effects)], now_ms)
        self._metrics.topic(request.topic).count(done.effects)
        await self._commits.durable()
        if done.refusal is Refusal.ENDED:
            raise NotFound(f"message {request.msg_id!r} had ended (status {int(message.status)}); released")

    async def get(self, topic: str, msg_id: str) -> Message:
        """The message as committed: a change still in its group commit is
        waited for, never shown before it is durable."""
        self._lifecycle.check_serving()
        await self._commits.flush()
        self._metrics.topic(topic, exists=self._topics.has_topic(topic)).gets += 1
        message = self._store.get(topic, msg_id)
        if message is None:
            raise not_found(topic, msg_id)
        return message


def not_found(topic: str, msg_id: str) -> NotFound:
    return NotFound(f"no message {msg_id!r} in topic {topic!r}")
