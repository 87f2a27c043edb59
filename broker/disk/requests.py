"""The disk broker's message requests: send, pull, long poll, ack and nack,
delete, get (docs/api.md, "Semantics").

Each checks the node is serving (broker.core.lifecycle), has
broker.disk.messages step the message and carry the step out (in RAM,
and appended as one record: broker.disk.journal), and awaits the group
commit (through the journal) before answering -- except a pull on a
standalone node, answered before its record is durable (losing it is a
redelivery). These are the hot paths: a batch of sends is one append and
one fsync; an ackMsg of many ids is one record.

    send       new messages WAITING (READY at once if due); a duplicate id
               answers the stored message
    pull       READY -> CONSUMING, up to the batch and the in-flight caps
    long_poll  pull, or wait (broker.core.long_polls) until the topic has READY
               messages or the timeout passes
    ack        CONSUMING/READY/WAITING -> ACKED; nack: CONSUMING -> READY
    fenced     an ack, nack or extension of a delivery, only while it is current
    delete     live -> DELETED; `release` frees the msgId
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Awaitable, Callable, Sequence

from storage.entry import Message, Status
from storage.errors import NotFound
from storage.store import NewMessage
from wheel.clock import Clock

from ..core.lifecycle import Lifecycle
from ..core.long_polls import LongPolls
from ..core.params import AckRequest, DeleteRequest, FencedRequest, LongPollRequest, NewSend, PullRequest, as_sends
from ..core.transitions import Fencing, Refusal
from .journal import Journal
from .messages import Messages

_RESULT_MESSAGE = operator.itemgetter(1)  # a SendResult's message


class Requests:
    """The message requests of the disk broker. Runs on the event loop."""

    def __init__(self, messages: Messages, journal: Journal, lifecycle: Lifecycle, long_polls: LongPolls,
                 clock: Clock, *, pull_waits: bool) -> None:
        self._messages = messages
        self._journal = journal
        self._lifecycle = lifecycle
        self._long_polls = long_polls
        self._clock = clock
        # A pull waits for its record's fsync only in a cluster (there the
        # answer also waits for followers, as every write's).
        self._pull_waits = pull_waits

    def __repr__(self) -> str:
        return f"Requests(pull_waits={self._pull_waits})"

    async def send(self, sends: Sequence[NewSend | NewMessage], now_ms: int | None = None) -> list[Message]:
        """Store new messages at `now_ms` (None: the clock's now); answered
        once durable. An id whose message is alive (1-3) answers the stored
        message, unchanged. An id whose message has ended (4-7) is stored
        anew, the ended one released (as camellia does), unless the send
        asks for strict idempotence: then the stored message is answered
        unchanged while it is retained. A bare NewMessage (a Python
        caller's) is a send that is not strict, checked here (`as_sends`)."""
        checked = as_sends(sends)
        if now_ms is None:
            now_ms = self._clock.now_ms()
        self._lifecycle.check_serving()
        results, due = self._messages.send(checked, now_ms)
        await self._journal.durable()
        return self._messages.ready_now(list(map(_RESULT_MESSAGE, results)), due, now_ms)

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING: fewer at
        the in-flight caps. Answered before the record is durable on a
        standalone node (a pull lost in a crash is a redelivery)."""
        self._lifecycle.check_serving()
        messages = self._messages.pull(request)
        if messages is None:
            return []
        if self._pull_waits:
            await self._journal.durable()
        else:  # synced with the next ack's commit, if one comes soon
            self._journal.kick_soon()
        return messages

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY.
        `gone()` says the client hung up: then nothing is taken, and what
        was taken meanwhile goes back to READY with its retry unchanged."""
        return await self._long_polls.wait_ready(request.topic, request.long_polling_timeout_ms,
                                                 functools.partial(self.pull, request), self.give_back, gone)

    async def give_back(self, messages: list[Message]) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        if self._messages.give_back(messages):
            await self._journal.durable()

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
        for all; the status of each after it (None: no such message)."""
        self._lifecycle.check_serving()
        after, changed = self._messages.ack(topic, msg_ids, ack)
        if changed:
            await self._journal.durable()
        else:
            await self._journal.settled()  # an earlier change to them may still be in its commit, or unreplicated
        return after

    async def fenced(self, request: FencedRequest) -> list[Fencing]:
        """A fenced ack, nack or extension of each id (docs/api.md, "Leases"):
        carried out only while its delivery is the current one, one record
        and one fsync for all; each one's outcome."""
        self._lifecycle.check_serving()
        outcomes, changed = self._messages.fenced(request)
        if changed:
            await self._journal.durable()
        else:
            await self._journal.settled()
        return outcomes

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the id.
        An ended or unknown message raises NotFound (camellia's 404); with
        `release` an ended one is released all the same."""
        self._lifecycle.check_serving()
        message, done = self._messages.delete(request)
        if not done.effects:
            await self._journal.settled()
            raise NotFound(f"message {request.msg_id!r} has ended (status {int(message.status)})")
        await self._journal.durable()
        if done.refusal is Refusal.ENDED:
            raise NotFound(f"message {request.msg_id!r} had ended (status {int(message.status)}); released")

    async def get(self, topic: str, msg_id: str) -> Message:
        """The message as committed: a change still in its group commit is
        waited for, never shown before it is durable."""
        self._lifecycle.check_serving()
        await self._journal.flush()
        return self._messages.get(topic, msg_id)
