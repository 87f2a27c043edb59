"""`hourglass serve`: the process around a node (a DiskNode or RedisNode
of broker.node.standalone, or a ClusterNode of broker.node.cluster).

Start: set the umask to 077; make the data directory ready (made private
if missing; refused if read-only, or open to group or others without
--allow-shared-data-dir: storage.data_dir), open (and recover) it;
rebuild the ready and consuming queues, start the group-commit, wheel
and timer tasks, then listen. Every `checkpoint_interval_ms` the store
is checkpointed.
SIGTERM or SIGINT: stop accepting connections, answer long polls in
flight, finish the requests in flight, stop the wheel (its tick persisted),
commit, take a last checkpoint, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from storage import data_dir
from storage.errors import ConfigError, DataDirError, NewerFormatError, OlderFormatError
from storage.files import raise_descriptor_limit

from ..clock import SystemClock
from .config import ServeConfig
from .standalone import DiskNode, RedisNode

if TYPE_CHECKING:
    from replication.config import ClusterConfig

    from ..http.gate import Gate
    from .cluster import ClusterNode

log = logging.getLogger("hourglass.server")

# How long a stop waits for requests in flight (long polls are answered at once).
SHUTDOWN_TIMEOUT_S = 10
# A stop still running this long after SIGTERM logs what it waits on.
STOP_REPORT_S = 12.0
# The serving process's umask: besides the store's own files (made 0600,
# storage.fileutil), what libraries make in the data directory (pysyncobj's
# Raft journal, a snapshot's tar, the leadership log) is its owner's alone.
PRIVATE_UMASK = 0o077


async def checkpoint_every(interval_ms: int, checkpoint: Callable[[], Awaitable[None]],
                           fail: Callable[[BaseException, str], None], shed: Callable[[], None]) -> None:
    """Run `checkpoint` every interval. A failure stops the loop and is
    fatal (`fail`): the commit log would grow without bound; a restart
    recovers from it. While a checkpoint takes longer than an interval
    (its syncfs, on a busy disk), `shed` runs every interval: the mapped
    pages touched meanwhile go back to the page cache instead of counting
    in the node's RSS until the checkpoint ends (Store.shed)."""
    interval_s = interval_ms / 1000
    while True:
        await asyncio.sleep(interval_s)
        running = asyncio.ensure_future(checkpoint())
        try:
            while not (await asyncio.wait((running,), timeout=interval_s))[0]:
                shed()
            running.result()
        except Exception as e:
            fail(e, "a checkpoint")
            return
        finally:
            running.cancel()  # (done already, but when this loop is cancelled)


def report_slow_stop(after_s: float = STOP_REPORT_S) -> asyncio.TimerHandle:
    """Log every task still running (its name and the innermost lines of its
    stack) if the process has not stopped `after_s` from now: a stop that
    hangs says where."""
    def report() -> None:
        waits = []
        for task in asyncio.all_tasks():
            frames = task.get_stack(limit=6)
            where = " <- ".join(f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}"
                                for f in reversed(frames)) or repr(task.get_coro())
            waits.append(f"{task.get_name()} at {where}")
        log.warning("still stopping after %.0f s, waiting on: %s", after_s, "; ".join(sorted(waits)))
    return asyncio.get_running_loop().call_later(after_s, report)


async def _serve_until_stopped(node: DiskNode | RedisNode, describe: str, app: Gate | None = None) -> None:
    """Listen, run until SIGTERM/SIGINT or a fatal error, then stop taking
    work: answer long polls and finish the requests in flight."""
    server = await node.serve(describe, app)
    if node.config.shard is not None:
        from ..shards.supervisor import tell_ready
        tell_ready()
    ShortCollections.install()  # what opening made lives as long as the node: no collection walks it again
    await node.stop_asked.wait()
    report_slow_stop()
    await node.features.stop_pushing()  # first: what they have in flight is delivered again after the restart
    log.info("stopping: answering long polls, finishing requests")
    node.broker.begin_stop()
    await server.close(SHUTDOWN_TIMEOUT_S)


async def run_redis(config: ServeConfig) -> int:
    node = None
    try:
        node = RedisNode(config)
        await node.broker.start()
        await node.schedule_lease.open()  # the API's schedules, served from the first request
        await node.job_lease.open()  # the redriveMsgs jobs' records, served from the first request
        await node.open_flow()  # the pauses and topic settings, carried out from the first request
    except Exception as e:  # the error names the URL, its password hidden
        log.critical("%s", e)
        if node is not None:
            await node.broker.stop()
        return 1
    monitor = node.start_monitor()
    pushers = node.features.pushers  # (the schedules and jobs are the leases' to run)
    if pushers is not None:
        pushers.start(node.broker)
    node.schedule_lease.start()
    node.job_lease.start()
    await _serve_until_stopped(node, f"state in {node.broker.url}")
    monitor.cancel()
    failed = node.failure()
    await node.schedule_lease.stop()  # its lease let go: another node takes the schedules at once
    await node.job_lease.stop()  # the same of the jobs
    await node.close_flow()
    await node.broker.stop()
    log.info("stopped")
    return 1 if failed is not None else 0


async def run_cluster(config: ServeConfig, cluster: ClusterConfig) -> int:
    """A cluster node: serve HTTP (API, /_cluster/ log stream) at once, follow,
    lead when elected; SIGTERM hands the lead over before stopping."""
    # The cluster's modules, aiohttp's client among them (about 0.3 s of
    # start-up), load on a cluster node only, not on every standalone one.
    from .cluster import ClusterNode

    try:
        node = ClusterNode(config, cluster, SystemClock())
    except (OSError, NewerFormatError, OlderFormatError) as e:  # as a standalone node's (run)
        log.critical("cannot open the data directory %s: %s", config.data_path, e)
        return 1
    server = await node.serve(f"node {cluster.node_id} of {','.join(cluster.peers)}")
    ShortCollections.install()  # as _serve_until_stopped
    roles = asyncio.create_task(node.run(), name="roles")
    checkpoints = asyncio.create_task(checkpoint_every(config.checkpoint_interval_ms, node.checkpoint, node.fail,
                                                       lambda: node.state.store.shed()), name="checkpoints")
    monitor = node.start_monitor()
    roles.add_done_callback(lambda task: _roles_ended(node, task))
    await node.stop_asked.wait()
    report_slow_stop()
    log.info("stopping: handing over")
    roles.cancel()
    checkpoints.cancel()
    monitor.cancel()
    await asyncio.gather(roles, checkpoints, monitor, return_exceptions=True)
    await node.handover()
    await server.close(SHUTDOWN_TIMEOUT_S)
    await node.close()
    log.info("stopped")
    return 1 if node.failure() is not None else 0


def _roles_ended(node: ClusterNode, roles: asyncio.Task[None]) -> None:
    """The role loop ends only when cancelled: an error in it is fatal."""
    if not roles.cancelled():
        error = roles.exception()
        if error is not None:
            node.fail(error, "roles")


async def run_disk(config: ServeConfig) -> int:
    try:
        node = DiskNode(config)
    except (OSError, NewerFormatError, OlderFormatError) as e:  # one a check before could not foresee (a file in
        # it this user may not write), or a file a newer hourglass wrote, or one of a format no release reads any
        # more: refused as it is (docs/operations.md)
        log.critical("cannot open the data directory %s: %s", config.data_path, e)
        return 1
    node.broker.start()
    checkpoints = asyncio.create_task(checkpoint_every(config.checkpoint_interval_ms, node.checkpoint,
                                                       node.broker.fail, node.store.shed))
    monitor = node.start_monitor()
    node.features.start(node.broker, node.pushed_through)  # running redriveMsgs jobs resume from their cursors
    app = None
    if node.router is not None:  # a shard: the others' calls (all it serves running), and links to them
        app = node.app()
        await node.router.open()  # before its port: any request it takes may need another shard
    await _serve_until_stopped(node, "standalone" if config.shard is None else
                               f"shard {config.shard[0]} of {config.shard[1]} of {config.node_path}", app)
    if node.router is not None:
        await node.router.close()
    checkpoints.cancel()
    monitor.cancel()
    await node.features.stop()  # running jobs go on, a release not followed yet is followed, at the next start
    if node.failure() is not None:  # no last checkpoint over a state RAM and disk disagree on
        log.critical("exiting after a failure; the next start recovers from the commit log")
        return 1
    await node.broker.stop()
    try:
        node.store.checkpoint(node.clock.now_ms())  # the tasks are stopped: nothing can append now
    except OSError as e:  # a full disk: the next start replays the commit log instead
        log.critical("the last checkpoint failed: %r; the next start recovers from the commit log", e)
        return 1
    finally:
        node.store.close()
    log.info("stopped")
    return 0


async def run(config: ServeConfig) -> int:
    if config.backend != "disk":
        return await run_redis(config)
    if config.cluster is not None:
        return await run_cluster(config, config.cluster)
    return await run_disk(config)


def check_data_dir(config: ServeConfig) -> None:
    """Make the data directory ready before anything opens it
    (storage.data_dir.prepare), and refuse one group or others have any
    permission on, naming the command that makes it private; with
    --allow-shared-data-dir, warn instead. Raises DataDirError."""
    path = config.data_path
    data_dir.prepare(path)
    shared = data_dir.shared_entries(path)
    if not shared:
        return
    first, mode = shared[0]
    more = f", and {len(shared) - 1} more in it" if len(shared) > 1 else ""
    what = f"the data directory {path} is open to group or others ({first} has mode {mode:04o}{more})"
    if not config.allow_shared_data_dir:
        raise DataDirError(f"{what}: run `{data_dir.private_command(path)}`, or pass --allow-shared-data-dir")
    log.warning("%s; starting all the same (--allow-shared-data-dir)", what)


def shard_count(config: ServeConfig) -> int:
    """The shards this node runs (broker.shards.layout); ConfigError for a
    count this kind of node does not run."""
    if config.backend != "disk" or config.cluster is not None:
        if config.shards not in ("auto", "1"):
            kind = "a cluster node" if config.cluster is not None else "a node on --backend redis://"
            raise ConfigError(f"--shards {config.shards}: {kind} runs one process (docs/configuration.md, "
                              f"\"--shards\"); start it without --shards")
        return 1
    from ..shards.layout import resolve
    return resolve(config.node_path, config.shards)


# glibc's mallopt parameters (malloc.h), and the environment variables that set them instead.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")
# A block this large or larger is a mapping of its own, given back to the system when freed; the
# heap's free top beyond this much is given back too (glibc's defaults, before it moves them).
MMAP_THRESHOLD_BYTES = TRIM_THRESHOLD_BYTES = 128 * 1024
# Arenas the process's threads share (the fsync threads allocate little).
ARENA_MAX = 2


# The objects frozen after the last full collection that walked all of them, times this plus
# FROZEN_SLACK, or THAW_S since that walk, and the next full collection walks all of them again
# (`ShortCollections`).
FROZEN_GROWTH = 2
FROZEN_SLACK = 50_000
THAW_S = 600.0
# The youngest generation's threshold: a collection once this many more objects the collector
# tracks were made than freed (Python 3.11's 700, 3.13's 2,000).
YOUNG_THRESHOLD = 10_000


class ShortCollections:
    """The cyclic collector kept from walking what lives long (docs/
    internals.md, "The collector"). A full collection walks every object
    the collector tracks: with 10,000 schedules and the messages held, some
    85,000 objects and 40-65 ms with the loop stopped, every second or two.
    What survives a full collection is alive: it is frozen (`gc.freeze`),
    and the next full collections walk only what came since. A cycle among
    frozen objects that dies is not found by those; so once the frozen
    objects pass FROZEN_GROWTH times their count after the last walk of
    everything (plus FROZEN_SLACK), or THAW_S after that walk (a dead
    cycle may hold large buffers: a count bounds their number, not their
    bytes), they are thawed and the next full collection walks them all
    once. Frozen objects freed by their count of references are freed as
    ever. The count is kept as a bound: each full collection adds what it
    freezes (its survivors, the oldest generation's size), and frozen ones
    freed since are not taken off; only when the bound passes the limit is
    the frozen set counted exactly (`gc.get_freeze_count` walks it: some
    7 ms for 300,000 objects, too much for every full collection while
    messages are extended or held). The youngest generation is collected
    every YOUNG_THRESHOLD objects, not 700: a call of 1,000 ids makes a
    few thousand short-lived objects (its answer's rows, its changes), and
    at 700 each call had them walked 3-5 times while they lived (some
    1 µs a message of an ack pass). (Python 3.11-3.13's collector; on
    3.14, incremental, the node freezes once at its start and the rest
    does nothing.)"""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.walked = gc.get_freeze_count()  # frozen after the last full collection that walked everything
        self.frozen = self.walked  # at least the objects frozen now (an upper bound)
        self.walked_at = now()
        self.thawed = False  # the next full collection walks everything
        self.walks = 0  # full collections that walked everything (logged, and for tests)
        self.threshold = gc.get_threshold()  # (as it was: `uninstall` puts it back)

    @classmethod
    def install(cls, now: Callable[[], float] = time.monotonic) -> ShortCollections:
        """What opening made frozen now, and every full collection's survivors
        after it; the youngest generation collected every YOUNG_THRESHOLD."""
        gc.freeze()
        collections = cls(now)
        young, *older = collections.threshold
        gc.set_threshold(max(YOUNG_THRESHOLD, young), *older)
        gc.callbacks.append(collections.on_gc)
        return collections

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self.on_gc)
        gc.unfreeze()
        gc.set_threshold(*self.threshold)

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        if self.thawed:  # this one walked everything: what it left is alive
            self.thawed = False
            self.walks += 1
            gc.freeze()
            self.walked = self.frozen = gc.get_freeze_count()
            self.walked_at = self.now()
            log.debug("the collector walked every object (%d), %d alive after it", self.walks, self.walked)
            return
        limit = FROZEN_GROWTH * self.walked + FROZEN_SLACK
        survivors = len(gc.get_objects(generation=2))  # (what this collection left: the young ones are empty)
        self.frozen += survivors
        if self.frozen > limit:  # the bound passed: counted exactly
            self.frozen = gc.get_freeze_count() + survivors
        if self.frozen > limit or self.now() - self.walked_at > THAW_S:
            gc.unfreeze()  # into the oldest generation: the next full collection walks them all
            self.thawed = True
        else:
            gc.freeze()


def keep_malloc_lean() -> None:
    """glibc's malloc held to what the node keeps (docs/configuration.md,
    "Memory"): a fixed mmap threshold (glibc raises it after each large
    block freed, and then a pull's large answers come from the heap, whose
    holes stay resident among the messages held), the trim threshold at
    its default (glibc doubles it with the other, and may have done so
    while the node's modules were imported) and ARENA_MAX arenas. Not when
    the environment sets any of them (the user's choice), nor where the C
    library has no mallopt (musl answers it and ignores it; macOS has none)."""
    if any(name in os.environ for name in MALLOC_ENV):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    mallopt(M_ARENA_MAX, ARENA_MAX)


def serve(config: ServeConfig, argv: Sequence[str] = ()) -> int:
    """Run the node `config` describes; `argv`, its command line's
    arguments, starts its shards when it runs many."""
    os.umask(PRIVATE_UMASK)
    if config.shard is not None:
        from ..shards.supervisor import die_with_node
        die_with_node()
    if config.backend == "disk":  # a standalone or cluster node
        try:
            check_data_dir(config)
        except DataDirError as e:
            log.critical("%s", e)
            return 1
    if config.shard is None:
        try:
            count = shard_count(config)
        except ConfigError as e:
            log.critical("%s", e)
            return 1
        if count > 1:
            from ..shards import supervisor
            supervisor.become(config.host, config.port, config.node_path, count, argv)
    if config.backend == "disk":
        raise_descriptor_limit()  # before its store sizes its cache of open files by it
    keep_malloc_lean()
    try:
        import uvloop  # a faster event loop where it is installed (Linux, macOS)
    except ImportError:
        return asyncio.run(run(config))
    return uvloop.run(run(config))
