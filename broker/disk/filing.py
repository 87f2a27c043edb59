"""Stored WAITING messages on their way to the timing wheel, and what keeps
the wheel's persisted tick behind them.

A send (or a reschedule, a re-drive) is appended to the commit log now;
the group commit applies it and hands its index entry to the wheel
(`on_committed`) a moment later. In between, the wheel does not know it:
`unfiled` counts such messages per filing second (the later of the trigger
time and the send's time, as the store files it), and `cap` keeps the tick
written to disk from passing the first of those seconds, since a restart
starts the wheel from the tick and must find the message:

    send m (trigger 12:00:05)   -> add: unfiled {12:00:05: 1}
    wheel released up to 12:00:07 -> cap(tick 12:00:07) = 12:00:05
    group commit applies m      -> on_committed: unfiled {}, wheel holds m

A message filed in a far-future span (storage.spans) does not go to the
wheel: the span mover (broker.disk.span_moves) brings it nearer when its span
falls due, and is woken by `span_filed` to replan once such a message is
applied.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from storage.entry import MS_PER_SECOND, IndexEntry, Location, Message
from storage.spans import is_span
from wheel.scheduler import Scheduler
from wheel.tick_state import TickState
from wheel.window import abs_second

# Files whose is_span verdict is remembered (cleared when more: a send's few)
SPAN_CACHE_FILES = 1024


class Filing:
    """The wheel's door for new, moved and cancelled WAITING messages. Runs
    on the event loop."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._unfiled: dict[int, int] = defaultdict(int)  # filing second -> messages appended, not handed over
        self.span_filed = asyncio.Event()  # a message was filed in a span
        self._spans: dict[int, bool] = {}  # file id -> is_span(it), for the files of recent sends
        # Told of each cancel (the node's recurring schedules: a pending run
        # deleted, acked or moved is theirs to follow, broker.schedules).
        self.on_cancel: Callable[[Location], None] | None = None

    def __repr__(self) -> str:
        return f"Filing(unfiled={sum(self._unfiled.values())}, first={min(self._unfiled, default=None)})"

    def add(self, location: Location, trigger_ms: int, now_ms: int) -> None:
        """A WAITING message appended at `now_ms` (not yet durable)."""
        if not self._is_span(location.hour):  # (a span's wakes the span mover once applied: on_committed)
            self._unfiled[max(trigger_ms, now_ms) // MS_PER_SECOND] += 1  # the second the store files it under

    def add_many(self, messages: Iterable[Message], now_ms: int) -> None:
        """`add` of each new WAITING message appended at `now_ms` (a send's)."""
        for m in messages:
            self.add(m.location, m.trigger_ms, now_ms)

    def _is_span(self, file_id: int) -> bool:
        """storage.spans.is_span(file_id), remembered for recent files."""
        spans = self._spans
        span = spans.get(file_id)
        if span is None:
            if len(spans) >= SPAN_CACHE_FILES:
                spans.clear()
            span = spans[file_id] = is_span(file_id)
        return span

    def on_committed(self, entries: Sequence[IndexEntry]) -> None:
        """The group commit applied these entries: the wheel holds them now,
        and the span mover replans if one went to a span (woken only now: a
        store that has not applied a send does not know its span yet)."""
        unfiled = self._unfiled
        filed = [entry for entry in entries if not self._is_span(entry.hour)]  # a span's: refile() brings them in time
        if len(filed) < len(entries):
            self.span_filed.set()
        self._scheduler.on_new_many(filed)
        for entry in filed:
            second = abs_second(entry)
            left = unfiled[second] - 1
            if left > 0:
                unfiled[second] = left
            else:
                del unfiled[second]

    def cancel(self, location: Location) -> None:
        """The WAITING message at `location` left WAITING other than by its
        release (acked, deleted, moved, made READY by its request)."""
        self._scheduler.cancel(location)
        if self.on_cancel is not None:
            self.on_cancel(location)

    def cap(self, tick: TickState) -> TickState:
        """`tick`, or the wheel's own if earlier, or the first second holding
        a message not handed over yet if earlier still."""
        tick = min(tick, self._scheduler.tick, key=lambda t: t.position)
        if not self._unfiled:
            return tick
        return min(tick, TickState.at(min(self._unfiled), 0), key=lambda t: t.position)
