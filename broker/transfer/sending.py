"""The one way in: messages sent to a node in batches a topic
(docs/operations.md, "Moving messages"), by importMsgBatch: each with the
status (pending or dead) and retry count it keeps.

Every message carries its msgId and every batch is strict:
a message the node holds (or ended and still keeps) is answered as stored,
never stored again, so an import killed anywhere and run again stores
nothing twice. A batch the node refuses for one message (400 naming
`msgs[i]`) goes again without it, the message set aside with the node's
reason; one too large for the node's body caps (413) goes in halves. A
batch that fails otherwise (the node gone, after the client's retries)
stops the import: what was answered 200 is stored, the rest is sent again
by the next run.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TextIO

import orjson

from ..client import DelayQueueClient, DelayQueueError, NewMsg

log = logging.getLogger("hourglass.transfer")

# A batch's 400 that names one of its messages: "msgs[3].delayMillis: must be ..."
_ITEM = re.compile(r"msgs\[(\d+)\]")
# Seconds between two progress lines.
PROGRESS_S = 5.0


class Outgoing(NamedTuple):
    """A message to import: its topic, the send, and the status (1:
    pending, at its trigger time; 5, 6: dead) and retry count it keeps."""
    topic: str
    msg: NewMsg
    status: int = 1
    retry: int = 0


@dataclass
class Tally:
    """What an import did: messages answered 200 (`sent`), set aside by
    the node (`refused`, each with its reason in the rejects file), and
    not sent at all, by reason (`skipped`: the source's own rule ended
    them, or a dry run)."""

    sent: int = 0
    refused: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {"sent": self.sent, "refused": self.refused, "skipped": dict(sorted(self.skipped.items()))}


class Sender:
    """Sends (topic, message) pairs to a node: `batch` messages of a topic
    a call, at most `in_flight` calls at once, at most `rate` messages a
    second (None: as fast as the node answers)."""

    def __init__(self, client: DelayQueueClient, *, batch: int, in_flight: int, rate: float | None,
                 rejects: TextIO | None, tally: Tally | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._batch = batch
        self._slots = asyncio.Semaphore(in_flight)
        self._rate = rate
        self._rejects = rejects
        self._clock = clock
        self.tally = Tally() if tally is None else tally  # (an import's kept counts go on)
        self._started = clock()
        self._paced = 0  # messages the pace has let through
        self._said = self._started

    async def send(self, messages: Sequence[Outgoing]) -> None:
        """Every message sent (or set aside), in batches a topic; returns
        once each batch is answered. Raises what a batch failed with."""
        by_topic: dict[str, list[Outgoing]] = {}
        for out in messages:
            by_topic.setdefault(out.topic, []).append(out)
        calls = [self._call(topic, msgs[i:i + self._batch])
                 for topic, msgs in by_topic.items() for i in range(0, len(msgs), self._batch)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._progress()

    async def _call(self, topic: str, msgs: list[Outgoing]) -> None:
        async with self._slots:
            await self._pace(len(msgs))
            await self._batch_of(topic, msgs)

    async def _pace(self, count: int) -> None:
        if self._rate is None:
            return
        self._paced += count
        wait_s = self._started + self._paced / self._rate - self._clock()
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    async def _batch_of(self, topic: str, msgs: list[Outgoing]) -> None:
        while msgs:
            try:
                await self._client.import_batch(topic, [(o.msg, o.status, o.retry) for o in msgs])
            except DelayQueueError as error:
                if error.code == 413 and len(msgs) > 1:
                    half = len(msgs) // 2
                    await self._batch_of(topic, msgs[:half])
                    msgs = msgs[half:]
                    continue
                if error.code not in (400, 413):
                    raise
                found = _ITEM.match(error.msg)
                index = int(found.group(1)) if found is not None and len(msgs) > int(found.group(1)) else None
                refused = msgs if index is None else [msgs[index]]
                for msg in refused:
                    self._refuse(topic, msg, f"{error.code} {error.msg}")
                msgs = [] if index is None else msgs[:index] + msgs[index + 1:]
                continue
            self.tally.sent += len(msgs)
            return

    def _refuse(self, topic: str, out: Outgoing, reason: str) -> None:
        self.tally.refused += 1
        log.warning("the node refused %s/%s: %s", topic, out.msg.msg_id, reason)
        if self._rejects is not None:
            self._rejects.write(orjson.dumps({"topic": topic, "msgId": out.msg.msg_id, "reason": reason}).decode()
                                + "\n")
            self._rejects.flush()

    def _progress(self) -> None:
        now = self._clock()
        if now - self._said >= PROGRESS_S:
            self._said = now
            elapsed = now - self._started
            log.info("sent %d messages (%.0f a second), %d refused, %d skipped", self.tally.sent,
                     self.tally.sent / elapsed if elapsed > 0 else 0.0, self.tally.refused,
                     sum(self.tally.skipped.values()))
