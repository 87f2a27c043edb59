"""The disk broker: one node's queues over the disk store, a
`broker.backend.Backend` (the rules a client sees: docs/api.md).

Where each status lives:

    1 WAITING     on disk only; the timing wheel (wheel.Scheduler) reads it
                  back a few seconds before its trigger and releases it
    2 READY       on disk; RAM holds a bounded window of them per topic
                  (broker.disk.windows), each with an expiry timer; the rest are
                  refilled from disk
    3 CONSUMING   on disk, and in RAM with an ack-deadline timer, capped
                  per topic (a pull at the cap takes fewer)
    4..7 final    on disk only, readable by getMsg until the hour retires

What each request or timer does to a message is one pure function,
broker.core.transitions.step, whose table is the lifecycle; every change it
makes is one status record appended to the commit log, and a request is
answered only once its record is durable (a pull on a standalone node:
before; a crash then redelivers it).

The broker is built of parts, each owning its state, built here in the
order they depend on one another (each takes only parts built before it):

    long_polls    LongPolls: pulls waiting on their topic (broker.core.long_polls)
    lifecycle     Lifecycle: serving, stopping, failed (broker.core.lifecycle)
    scheduler     the timing wheel, from the tick a restart resumes at
    filing        Filing: messages on their way to the wheel; the tick's cap
    commits       GroupCommit: many records, one fsync; hands the applied
                  index entries to `filing`
    journal       Journal: appends records, and awaits them durable (the
                  group commit's); a failed append fails the node
    windows       ReadyWindows: READY windows, CONSUMING messages, their
                  timers (broker.disk.timers), refills; carries steps out
                  on them
    topics        Topics: topic names, the --max-topics cap, TopicInfo
    messages      Messages: the one part that steps messages (held or
                  stored) and carries the steps out; the releases
    driver        WheelDriver: sleeps until the wheel is due, hands its
                  releases to `messages`, then its tick to `_persist_tick`
    span_mover    SpanMover: files far-future spans' messages nearer

and, side by side over `messages` and `journal`, the requests:

    requests      Requests: send, pull, long poll, ack, delete, get (the
                  API calls it directly: broker.backend.MessageRequests)
    dead_letters  DeadLetters: reschedule, listDeadMsg, redrive
    bulk          Bulk: listMsg, deleteMsgs, rescheduleMsgs (broker.disk.bulk)

The Backend's calls are these parts' own methods (and `topics`'), bound
once in the constructor, as broker.redis.backend.RedisBroker binds its:
a request enters its part with no forwarding frame between. Then
recovery (broker.disk.recovery) puts what a restart finds back in the
built windows, and `start()` launches the tasks: the group commit, the
wheel, the timers, the refills and the span mover.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence

from storage.entry import Location, Message
from storage.errors import InvariantError, NotFound, Unavailable
from storage.store import PreparedCheckpoint, Store
from wheel.clock import Clock
from wheel.driver import WheelDriver
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState, TickStateFile

from ..core.lifecycle import Lifecycle
from ..core.long_polls import LongPolls
from ..core.params import Defaults
from ..observe.metrics import Metrics
from .bulk import Bulk
from .dead_letters import DeadLetters
from .filing import Filing
from .group_commit import GroupCommit, Replicated
from .journal import Journal
from .messages import Messages
from .ready import HeldMessage, QueueLimits, TopicQueue
from .recovery import recover
from .requests import Requests
from .span_moves import SpanMover
from .topics import Topics
from .windows import ReadyWindows

__all__ = ["Broker", "GroupCommit"]

log = logging.getLogger("hourglass.service")


class Broker:
    """One node's queues over a `Store`: a standalone node's, or a cluster
    leader's (`replicated`: a request is answered once followers have its
    record too). All methods run on the event loop; `start()` launches the
    tasks, `stop()` (after the server's requests) or `abandon()` ends them.

    A send, followed through the parts: `requests` checks the topic cap
    (`topics`) and appends the messages WAITING (`journal`); `filing`
    counts each until the group commit (`commits`) has made it durable and
    handed it to the wheel (`scheduler`); the answer waits for that fsync.
    When the trigger time comes, `driver` polls the wheel and hands the
    entries to `messages`, which steps each READY, has `windows` hold it
    (in its topic's window with its expiry timer, the topic's long polls
    woken) and appends the changes as one record."""

    def __init__(self, store: Store, clock: Clock, defaults: Defaults, metrics: Metrics, *,
                 tick_path: str, scheduler_config: SchedulerConfig | None = None,
                 replicated: Replicated | None = None, apply_lock: asyncio.Lock | None = None,
                 limits: QueueLimits | None = None) -> None:
        self.store = store
        self.clock = clock
        self.defaults = defaults  # what a request leaves out
        self.metrics = metrics
        self.limits = limits = limits or QueueLimits()
        now_ms = clock.now_ms()
        self.long_polls = long_polls = LongPolls(clock)  # (a node of many shards waits on them too: broker.shards)
        self._lifecycle = Lifecycle(long_polls, log, "the node stops serving and exits")
        self._tick_file = TickStateFile(tick_path, fsync=True)  # (this part's to write and close)
        self.scheduler = Scheduler(store, self._tick_file.state, now_ms, scheduler_config or SchedulerConfig())
        self._filing = Filing(self.scheduler)
        self.commits = GroupCommit(store, self._filing.on_committed, metrics, replicated, apply_lock)
        self._journal = journal = Journal(store, self._lifecycle, self.commits)
        self._windows = ReadyWindows(store, clock, limits, long_polls, journal, self.commits, self._lifecycle)
        topics = Topics(store, clock, self.commits, self._windows, limits)
        self._messages = messages = Messages(store, clock, metrics, self._windows, self._filing, journal, topics)
        self.driver = WheelDriver(self.scheduler, clock, messages.release, persist_tick=self._persist_tick)
        self._span_mover = SpanMover(store, clock, self._lifecycle, self.commits, self._filing.span_filed)
        self.requests = requests = Requests(messages, journal, self._lifecycle, long_polls, clock,
                                            pull_waits=replicated is not None)
        dead_letters = DeadLetters(store, messages, journal, self._lifecycle, page_bytes=limits.page_bytes)
        self._bulk = bulk = Bulk(store, messages, journal, self._lifecycle, limits.page_bytes)
        recover(store, self._windows, defaults.ack_timeout_ms, now_ms)
        self._tasks: list[asyncio.Task[None]] = []
        # == the Backend's calls (broker.backend.Backend) ==========================
        self.send = requests.send
        self.pull = requests.pull
        self.long_poll = requests.long_poll
        self.ack = requests.ack
        self.ack_many = requests.ack_many
        self.delete = requests.delete
        self.get = requests.get
        self.give_back = requests.give_back  # (a long poll's client gone: another shard's poll took them here)
        self.reschedule = dead_letters.reschedule
        self.retry_at = dead_letters.retry_at
        self.list_dead = dead_letters.list_dead
        self.redrive = dead_letters.redrive
        self.redrive_all = dead_letters.redrive_all
        self.redrive_slice = dead_letters.redrive_slice  # (a redriveMsgs job's: broker.jobs)
        self.list_msgs = bulk.page
        self.export_msgs = bulk.export_page
        self.count_msgs = bulk.count
        self.delete_msgs = bulk.delete
        self.reschedule_msgs = bulk.reschedule
        self.topic_info = topics.topic_info
        self.topic_infos = topics.topic_infos
        self.topic_list = topics.topic_list
        self.topic_backlogs = topics.topic_backlogs
        self.has_topic = topics.has_topic
        # (priority, triggerTime) of what a pull of a topic takes first here (a node of shards
        # orders its pulls by it)
        self.best_head = self._windows.best_head
        # == pauses (broker.flow.keeper's PauseGate): pulls, long polls and pushes
        # take nothing more of a paused topic or serial key; a resume wakes its long polls
        self.pause = self._windows.pause
        self.resume = self._windows.resume
        self.expire_paused = bulk.expire_paused  # (a resume's `expire`)
        self.paused_for = self._windows.paused_for  # (the schedules' runs a pause holds back: on_hold)
        # a topic's fairness, fairKey (on) or none (docs/api.md, "Fairness between
        # tenants"), release rate and due-age cap: RAM state only, set again at a
        # start by who keeps the settings (broker.flow.keeper)
        self.set_fairness = self._windows.set_fairness
        self.set_flow = self._windows.set_flow
        # on a node of shards, this shard's share of each topic's rate, moved by
        # demand (broker.shards.rates)
        self.release_shares = self._windows.release_shares
        self.rated_topics = self._windows.rated_topics
        self.set_release_share = self._windows.set_release_share

    def set_dedup_window(self, topic: str, window_ms: int) -> None:
        """The topic's dedupWindowMillis (0: none, camellia's rule), from
        now on (docs/api.md, "Deduplication window"): its messages' ends
        kept while it has one, and a send of an id whose message ended
        within it answered with the ended message. RAM state, set again at
        a start by who keeps the setting (broker.flow)."""
        windows = self._messages.dedup_windows
        if window_ms:
            windows[topic] = window_ms
        else:
            windows.pop(topic, None)
        self.store.keep_ends(topic, bool(window_ms))

    def __repr__(self) -> str:
        return f"Broker({self._lifecycle!r}, {self._messages!r}, tick={self.tick}, {self._filing!r})"

    # == lifetime ================================================================

    def start(self) -> None:
        if self.store.parts_held():  # a bulk call's parts whose COMMIT never came: abandoned whole
            self._journal.commit_parts(0, self.clock.now_ms())
            self.commits.kick()
        self._tasks = [asyncio.create_task(self.commits.run(), name="group-commit")]
        self._tasks[0].add_done_callback(self._lifecycle.task_ended)
        if self.store.intents_held():  # a large rescheduleMsgs cut short: carried out whole, then the dispatch
            self._tasks.append(asyncio.create_task(self._carry_out_intents(), name="intents"))
            self._tasks[1].add_done_callback(self._lifecycle.task_ended)
        else:
            self._start_dispatch()

    def _start_dispatch(self) -> None:
        """The wheel, the timers, the window refills and the span mover."""
        tasks = [asyncio.create_task(self.driver.run(), name="wheel"),
                 asyncio.create_task(self._windows.run_timers(self._messages.fire), name="timers"),
                 asyncio.create_task(self._windows.run_refills(), name="refills"),
                 asyncio.create_task(self._span_mover.run(), name="span-moves")]
        for task in tasks:
            task.add_done_callback(self._lifecycle.task_ended)
        self._tasks += tasks

    async def _carry_out_intents(self) -> None:
        """Before any message is released, refilled or refiled: one due at
        its old time, or a far one refiled, would otherwise be delivered
        where the call moves it from (requests are served meanwhile; pulls
        find the windows as they were)."""
        try:
            await self._bulk.carry_out_intents()
        except Unavailable:
            if not self._lifecycle.stopping:  # (stopped or deposed meanwhile: the next node to serve goes on)
                raise  # fails the node (task_ended): an INTENT held would hold every checkpoint
            return
        if not self._lifecycle.stopping:
            self._start_dispatch()

    async def stop(self) -> None:
        """After the HTTP server has finished its requests: stop the wheel
        (persisting its tick), commit, stop the tasks."""
        self.begin_stop()
        self.driver.stop()
        self._windows.wake_timers()
        self._windows.wake_refills()
        self._filing.span_filed.set()
        dispatch = [task for task in self._tasks if task.get_name() in ("wheel", "timers")]
        if dispatch:  # (none yet while an INTENT is carried out at start)
            await asyncio.wait(dispatch, timeout=10)
        await self.commits.flush()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tick_file.close()

    async def abandon(self) -> None:
        """Stop at once without waiting for anything to replicate (this node
        no longer leads): answer every request in flight 503, stop the tasks."""
        self.begin_stop()
        self.driver.stop()
        for task in self._tasks:
            task.cancel()
        self.commits.abandon()  # before waiting: a task that waits for a commit is answered now
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tick_file.close()

    async def _persist_tick(self, tick: TickState) -> None:
        """The wheel's tick moves only past durable releases, and never past a
        message still in its group commit (`filing.cap`: a restart must read
        its second); releases a quorum did not acknowledge in time leave it."""
        if await self._journal.background_durable("released messages"):
            self._tick_file.write(self._filing.cap(tick))

    async def prepared_at_quiet_point(self, prepare: Callable[[], PreparedCheckpoint]) -> PreparedCheckpoint:
        """`prepare` (a checkpoint's first step) run by the group commit at a
        quiet point: everything appended applied, and the wheel told of it."""
        prepared = await self.commits.at_quiet_point(prepare)
        if not isinstance(prepared, PreparedCheckpoint):
            raise InvariantError(f"a quiet point answered {prepared!r}, not the checkpoint prepared")
        return prepared

    def begin_stop(self) -> None:
        """Refuse new work (503) and answer every long poll now."""
        self._lifecycle.begin_stop()

    def fail(self, error: BaseException, where: str) -> None:
        """Stop serving for good: RAM and disk may disagree (broker.core.lifecycle)."""
        self._lifecycle.fail(error, where)

    def wake_all(self) -> None:
        """Answer every long poll now (going offline, broker.http.health)."""
        self.long_polls.wake_all()

    @property
    def failed(self) -> BaseException | None:
        """Why the broker stopped itself (None: it did not)."""
        return self._lifecycle.failed

    @failed.setter
    def failed(self, error: BaseException | None) -> None:
        self._lifecycle.failed = error

    @property
    def on_fatal(self) -> Callable[[BaseException], None] | None:
        """Called once when the broker stops itself (the server exits)."""
        return self._lifecycle.on_fatal

    @on_fatal.setter
    def on_fatal(self, callback: Callable[[BaseException], None] | None) -> None:
        self._lifecycle.on_fatal = callback

    @property
    def on_release(self) -> Callable[[Sequence[Message], int], Sequence[Location]] | None:
        """Told of each release before it is carried out (broker.disk.messages'
        hook: the node's recurring schedules, broker.schedules.keeper)."""
        return self._messages.on_release

    @on_release.setter
    def on_release(self, hook: Callable[[Sequence[Message], int], Sequence[Location]] | None) -> None:
        self._messages.on_release = hook

    @property
    def on_hold(self) -> Callable[[Sequence[Message], int], Collection[Location]] | None:
        """Told of each release first: answers the messages it holds back,
        left WAITING until `release_held` (broker.disk.messages' hook: the
        runs of recurring schedules whose topic is paused, broker.schedules.keeper)."""
        return self._messages.on_hold

    @on_hold.setter
    def on_hold(self, hook: Callable[[Sequence[Message], int], Collection[Location]] | None) -> None:
        self._messages.on_hold = hook

    async def release_held(self, topic: str, msg_ids: Sequence[str]) -> int:
        """These WAITING messages of the topic released now if due (never
        before their trigger time), told to `on_hold` and `on_release` as
        the wheel's releases are: the runs a pause held back, once it is
        over (broker.schedules.keeper). How many were due and waiting."""
        found = []
        for msg_id in msg_ids:
            try:
                found.append(await self.get(topic, msg_id))
            except NotFound:
                continue
        self._lifecycle.check_serving()
        return self._messages.release_held(found)

    @property
    def on_cancel(self) -> Callable[[Location], None] | None:
        """Told of each WAITING message that leaves WAITING other than by its
        release: deleted, acked, moved (broker.disk.filing's hook: the node's
        recurring schedules, broker.schedules)."""
        return self._filing.on_cancel

    @on_cancel.setter
    def on_cancel(self, hook: Callable[[Location], None] | None) -> None:
        self._filing.on_cancel = hook

    @property
    def tick(self) -> TickState | None:
        """The tick last persisted: what a follower may take over from."""
        return self._tick_file.state

    # == what RAM holds, for tests and introspection (broker.disk.windows) ===========

    @property
    def topics(self) -> dict[str, TopicQueue]:
        """Each topic's ready window and consuming count."""
        return self._windows.topics

    @property
    def live(self) -> dict[Location, HeldMessage]:
        """Every message RAM holds: the windows' READY ones and the CONSUMING ones."""
        return self._windows.held

    @property
    def window_total(self) -> int:
        return self._windows.window_total

    @property
    def parked_total(self) -> int:
        return self._windows.parked_total

    @property
    def key_spilled_total(self) -> int:
        return self._windows.key_spilled_total

    @property
    def consuming_total(self) -> int:
        return self._windows.consuming_total
