"""The disk broker's request methods: send, pull, long poll, ack and nack,
delete, get, and the topic information reads (SPEC.md section 3).

Each checks the node is serving, changes RAM (broker.windows), appends its
status changes as one record (`_update`), and awaits the group commit
(broker.group_commit) before answering -- except a pull on a standalone
node, answered before its record is durable (losing it is a redelivery).
These are the hot paths: per-message loops here call nothing they do not
need (a batch of sends is one append and one fsync; an ackMsg of many ids
is one record).

    send       new messages WAITING (READY at once if due); a duplicate id
               answers the stored message
    pull       READY -> CONSUMING, up to the batch and the in-flight caps
    long_poll  pull, or wait (broker.long_poll) until the topic has READY
               messages or the timeout passes
    ack        CONSUMING/READY/WAITING -> ACKED; nack: CONSUMING -> READY
    delete     live -> DELETED; `release` frees the msgId

`Operations` is a part of `broker.service.Broker` (a mixin).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, Message, Status
from storage.errors import InvalidRequest, NotFound, Unavailable
from storage.spans import is_span
from storage.store import NewMessage, SendOutcome, StateChange, text_hash, total_counts

from .backend import WAITING_BUCKETS, topic_cap_error, topic_info_json, waiting_bucket
from .params import AckRequest, DeleteRequest, LongPollRequest, NewSend, PullRequest, as_sends
from .ready import Live
from .redact import client_text
from .windows import INLINE_KEY_REFILLS, INLINE_REFILL_SCAN

# Index entries classified per slice by getTopicInfo before it lets other
# work run (a large hour would otherwise stall dispatch for its whole scan).
SCAN_CHUNK = 4096


class Operations:
    """The request methods of `broker.service.Broker` (its state: see there)."""

    # == requests ================================================================

    async def send(self, sends: Sequence[NewSend | NewMessage]) -> list[Message]:
        """Store new messages; answered once durable. An id whose message is
        alive (1-3) answers the stored message, unchanged. An id whose
        message has ended (4-7) is stored anew, the ended one released (as
        camellia does), unless the send asks for strict idempotence: then
        the stored message is answered unchanged while it is retained."""
        self._check_serving()
        sends = as_sends(sends)
        batch = [s.message for s in sends]
        new_topics = self._new_topics(batch)
        now_ms = batch[0].produce_ms if batch else self.clock.now_ms()
        results = self._store_new(batch, now_ms)
        self._topics_filing |= new_topics
        replace = [i for i, r in enumerate(results)
                   if r.outcome is SendOutcome.DUPLICATE and r.message.status.is_final and not sends[i].strict]
        if replace:  # rare: release the ended ones, then store those sends again
            ended = {results[i].message.location: results[i].message for i in replace}
            self._update([StateChange(m.location, m.status, m.retry, released=True) for m in ended.values()],
                         now_ms)
            for i, result in zip(replace, self._store_new([batch[i] for i in replace], now_ms)):
                results[i] = result
        unfiled, stored, duplicates, due_now = self._unfiled, 0, 0, False
        for outcome, message in results:
            if outcome is SendOutcome.STORED:
                stored += 1
                trigger_ms = message.trigger_ms
                if trigger_ms <= now_ms:
                    due_now = True
                    trigger_ms = now_ms
                if not is_span(message.location.hour):
                    unfiled[trigger_ms // MS_PER_SECOND] += 1
                else:
                    self._span_wake.set()
            else:
                duplicates += 1
        topics = {message.topic for _, message in results}
        if len(topics) == 1:  # sendMsgBatch: one topic, counted once
            m = self.metrics.topic(topics.pop())
            m.sends += stored
            m.duplicates += duplicates
        else:
            for outcome, message in results:
                m = self.metrics.topic(message.topic)
                if outcome is SendOutcome.STORED:
                    m.sends += 1
                else:
                    m.duplicates += 1
        await self.commits.durable()
        if not due_now:
            return [r.message for r in results]
        return self._release_due_now(results, now_ms)


    def _new_topics(self, batch: list[NewMessage]) -> set[str]:
        """The topics of `batch` the node does not have yet; LimitReached
        (429, nothing stored) if they would make more than --max-topics.
        Topics are counted as the store names them (a message in a live
        hour) plus those of sends appended and not yet applied."""
        has_topic = self.store.has_topic
        new = {topic for topic in {m.topic for m in batch} if not has_topic(topic)}
        if new:
            self._topics_filing = {topic for topic in self._topics_filing if not has_topic(topic)}
            topics = self.store.topic_count() + len(self._topics_filing)
            if topics + len(new - self._topics_filing) > self.limits.topics:
                raise topic_cap_error(topics, self.limits.topics)
        return new

    def _store_new(self, batch: list[NewMessage], now_ms: int) -> list:
        try:
            return self.store.send(batch, now_ms)
        except InvalidRequest:
            raise
        except OSError as e:  # nothing was kept (the store undoes a failed append)
            raise Unavailable(f"the commit log refused the write: {client_text(e)}") from e

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING: fewer at
        the in-flight caps. Answered before the record is durable on a
        standalone node (a pull lost in a crash is a redelivery)."""
        self._check_serving()
        queue = self.topics.get(request.topic)
        if queue is None:
            return []
        limits = self.limits
        room = min(request.batch, limits.inflight - queue.consuming, limits.inflight_total - self.consuming_total)
        if room <= 0:
            return []
        if (queue.key_scan or queue.key_spilled) and len(queue.ready) < limits.window:
            free = [k for k in dict.fromkeys((*queue.key_spilled, *queue.key_scan)) if k not in queue.busy]
            for serial_key in free[:INLINE_KEY_REFILLS]:
                self._refill_key(queue, serial_key)
        if queue.spilled and len(queue.ready) < limits.window:
            # Top the window up first (after a restart it starts empty; a send
            # may have put a message in it while older ones wait on disk), so
            # the pull picks by priority among as many as the window holds. A
            # pull may take the window over the total cap by its batch.
            want = min(limits.window - len(queue.ready),
                       max(room, limits.window_total - self.window_total + self.parked_total))
            self._refill(queue, want, max_scan=INLINE_REFILL_SCAN)
        if not queue.ready:
            return []
        tags = frozenset(request.tags) if request.tags else None
        now_ms = self.clock.now_ms()
        taken: list[Live] = []
        while len(taken) < room:
            location = queue.best(tags)
            if location is None:
                break
            live = self.live[location]
            live.retry += 1  # retry counts deliveries: 1 on the first (camellia)
            self._consume(live, now_ms + request.ack_timeout_ms)
            taken.append(live)
        self._schedule_refill(queue)
        if not taken:
            return []
        self._update([StateChange(live.location, Status.CONSUMING, live.retry, deadline_ms=live.deadline_ms,
                                  prev_status=Status.READY, topic_hash=live.topic_hash) for live in taken], now_ms)
        messages = []
        for live in taken:
            if live.message is None:
                messages.append(self.store.read_message(live.location))
            else:
                messages.append(live.message._replace(status=Status.CONSUMING, retry=live.retry))
                live.message = None
        self.metrics.topic(request.topic).pulled(messages, now_ms)
        if self._pull_waits:
            await self.commits.durable()
        else:
            self.commits.kick()
        return messages

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = lambda: False) -> list[Message]:
        """As pull, but waits up to the timeout for a message to be READY.
        `gone()` says the client hung up: then nothing is taken, and what
        was taken meanwhile goes back to READY with its retry unchanged."""
        return await self._wait_ready(request.topic, request.long_polling_timeout_ms,
                                      functools.partial(self.pull, request), self._give_back, gone)

    async def _give_back(self, messages: list[Message]) -> None:
        """Pulled for a client that is gone: READY again, as if never pulled."""
        changes = []
        for message in messages:
            live = self.live.get(message.location)
            if live is not None and live.status is Status.CONSUMING:
                self._requeue(live, live.retry - 1)
                changes.append(StateChange(live.location, Status.READY, live.retry, prev_status=Status.CONSUMING,
                                           topic_hash=live.topic_hash))
                self._wake(live.topic)
        if changes:
            self._update(changes, self.clock.now_ms())
            await self.commits.durable()

    def _message(self, topic: str, msg_id: str) -> Message:
        message = self.store.get(topic, msg_id)
        if message is None:
            raise NotFound(f"no message {msg_id!r} in topic {topic!r}")
        return message

    async def ack(self, request: AckRequest) -> None:
        """ack: WAITING, READY or CONSUMING -> ACKED (never delivered after).
        nack: CONSUMING -> READY now, or ENDED after its last delivery.
        Anything else -- an unknown id, an ended message, a nack of a
        message not consuming -- changes nothing and is no error (camellia)."""
        await self.ack_many(request.topic, [request.msg_id], request.ack)

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id in turn, one record and one fsync for all; the
        status of each after it (None: no such message)."""
        self._check_serving()
        now_ms = self.clock.now_ms()
        changes: list[StateChange] = []
        after: dict[str, Status | None] = {}
        for msg_id in msg_ids:
            if msg_id in after:  # a repeated id: once
                continue
            change, after[msg_id] = self._ack_one(topic, msg_id, ack, now_ms)
            if change is not None:
                changes.append(change)
        if changes:
            self._update(changes, now_ms)
            await self.commits.durable()
        else:
            await self.commits.flush()  # an earlier change to them may still be in its commit
        return [after[msg_id] for msg_id in msg_ids]

    def _ack_one(self, topic: str, msg_id: str, ack: bool, now_ms: int) -> tuple[StateChange | None, Status | None]:
        """The change an ack or nack of one id makes (None: none), and the
        message's status after it (None: no such message)."""
        live = self._inflight.get((topic, msg_id))
        if live is not None:  # consuming (every consuming message is held): no disk read
            m = self.metrics.topic(topic)
            if not ack:
                m.nacks += 1
                change = self._retry_or_end(live, now_ms)
                return change, change.status
            self._forget(live)
            m.acks += 1
            return StateChange(live.location, Status.ACKED, live.retry, prev_status=Status.CONSUMING,
                               topic_hash=live.topic_hash), Status.ACKED
        message = self.store.get(topic, msg_id)
        m = self.metrics.topic(topic, exists=message is not None)
        if message is None:
            return None, None
        if not ack or message.status.is_final:  # (a nack of one not held consuming changes nothing)
            return None, message.status
        if message.status is Status.WAITING:
            self.scheduler.cancel(message.location)
        elif (live := self.live.get(message.location)) is not None:  # READY in the window (beyond it: none)
            self._forget(live)
        m.acks += 1
        return StateChange(message.location, Status.ACKED, message.retry), Status.ACKED

    async def delete(self, request: DeleteRequest) -> None:
        """WAITING, READY or CONSUMING -> DELETED; `release` also frees the id.
        An ended or unknown message raises NotFound (camellia's 404); with
        `release` an ended one is released all the same."""
        self._check_serving()
        message = self._message(request.topic, request.msg_id)
        status = message.status
        was_live = not status.is_final
        if status is Status.WAITING:
            self.scheduler.cancel(message.location)
            status = Status.DELETED
        elif status in (Status.READY, Status.CONSUMING):
            live = self.live.get(message.location)
            if live is not None:
                self._forget(live)
            status = Status.DELETED
        elif not request.release:
            await self.commits.flush()
            raise NotFound(f"message {request.msg_id!r} has ended (status {int(status)})")
        self._update([StateChange(message.location, status, message.retry, released=request.release)],
                     self.clock.now_ms())
        self.metrics.topic(request.topic).deletes += 1
        await self.commits.durable()
        if not was_live:
            raise NotFound(f"message {request.msg_id!r} had ended (status {int(status)}); released")

    async def get(self, topic: str, msg_id: str) -> Message:
        """The message as committed: a change still in its group commit is
        waited for, never shown before it is durable."""
        self._check_serving()
        await self.commits.flush()
        self.metrics.topic(topic, exists=self.has_topic(topic)).gets += 1
        return self._message(topic, msg_id)

    # == topic information =======================================================

    async def topic_info(self, topic: str) -> dict:
        """camellia's TopicInfo: queue sizes and the waiting queue's delay
        buckets, once every change made so far is committed."""
        return (await self.topic_infos([topic]))[0]

    async def topic_infos(self, topics: Sequence[str]) -> list[dict]:
        """`topic_info` of each of `topics`, in one pass: an hour that
        straddles a bucket edge is read once for all of them (its entries,
        a slice at a time between requests), not once per topic."""
        await self.commits.flush()
        names = self.store.topic_names()
        now_ms = self.clock.now_ms()
        infos, wanted, straddling = [], {}, set()
        for topic in topics:
            topic_hash = text_hash(topic)
            hours = self.store.topic_hours(topic_hash) if names.get(topic_hash) == topic else []
            buckets = [0] * len(WAITING_BUCKETS)
            for hour, counts in hours:
                if not counts[Status.WAITING]:
                    continue
                first_hour, last_hour = self.store.file_hours(hour)  # (a span covers many)
                first = waiting_bucket(first_hour * MS_PER_HOUR - now_ms)
                if first == waiting_bucket((last_hour + 1) * MS_PER_HOUR - 1 - now_ms):
                    buckets[first] += counts[Status.WAITING]
                else:
                    straddling.add(hour)
                    wanted[topic_hash] = buckets
            infos.append((topic, total_counts(hours), buckets))
        for hour in sorted(straddling):  # classify its waiting entries of the wanted topics
            start = 0
            while chunk := self.store.hour_entries(hour, start, SCAN_CHUNK):
                for entry in chunk:
                    buckets = wanted.get(entry.topic_hash)
                    if buckets is not None and entry.status is Status.WAITING:
                        buckets[waiting_bucket(entry.trigger_ms - now_ms)] += 1
                start += len(chunk)
                await asyncio.sleep(0)
        return [topic_info_json(topic, totals[Status.WAITING], buckets, totals[Status.READY], totals[Status.CONSUMING])
                for topic, totals, buckets in infos]

    def topic_list(self) -> list[str]:
        names = set(self.store.topic_names().values()) | set(self.topics)
        return sorted(names)

    async def topic_backlogs(self) -> dict[str, tuple[int, int, int]]:
        """(waiting, ready, consuming) of every topic the store names
        (committed changes), summed over the hours' per-topic counts in one
        pass, SCAN_CHUNK (hour, topic) pairs between yields to the loop."""
        names = self.store.topic_names()
        totals = dict.fromkeys(names, (0, 0, 0))
        pairs = 0
        for counts_of_hour in self.store.hour_topic_counts():
            for topic_hash, counts in counts_of_hour:
                waiting, ready, consuming = totals.get(topic_hash, (0, 0, 0))
                totals[topic_hash] = (waiting + counts[Status.WAITING], ready + counts[Status.READY],
                                      consuming + counts[Status.CONSUMING])
            pairs += len(counts_of_hour)
            if pairs >= SCAN_CHUNK:
                pairs = 0
                await asyncio.sleep(0)
        return {names[topic_hash]: counts for topic_hash, counts in totals.items() if topic_hash in names}

    def has_topic(self, topic: str) -> bool:
        return topic in self.topics or self.store.has_topic(topic)
