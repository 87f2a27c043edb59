"""The mypyc build: the modules below compiled by mypyc into a wheel when
the build backend says so (build_backend/hourglass_build.py: where the
machine can compile, or as HOURGLASS_MYPYC asks; docs/dependencies.md,
"mypyc"). Everything else about the package is in pyproject.toml.

    pip install .                           # compiled where a C compiler and Python's headers are
    HOURGLASS_MYPYC=0 pip install .         # pure Python
    HOURGLASS_MYPYC=1 pip install .         # compiled, or the install fails

The compiled modules are C extensions built into the wheel, never next to
the sources: an editable install is always pure Python (the build backend,
build_backend/hourglass_build.py, refuses `HOURGLASS_MYPYC=1` with `-e`), so
it can never run a compiled module older than its source.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import shutil
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The modules mypyc compiles: those a request goes through (docs/benchmarks.md,
# "Compiled with mypyc", has bench/flow.py's figures). Every other module
# stays interpreted in the compiled wheel too, and these on purpose:
#   storage/errors.py       exceptions that subclass built-ins (ValueError...)
#   storage/disk.py         the calls where the disk can fail: tests hand the
#                           store a subclass of its Disk that is full, fails
#                           its syncs or counts them (tests/fakes.py), and an
#                           interpreted class cannot subclass a compiled one
#   broker/node/base.py     the cluster's node subclasses it, and an
#                           interpreted class cannot subclass a compiled one
#   broker/node/ (but config.py), console/, cli.py, client.py, spark.py,
#   transfer/:              start-up, the console, clients: not per request
#   broker/disk/syncer.py   per commit round, but its work is the fsync in
#                           its own thread (the GIL released); and
#                           tests/fakes.py wraps Syncer.sync (FakeClock's
#                           watch_threads): a compiled method cannot be replaced
#   broker/disk/bulk.py, broker/core/recurrence.py, broker/schedules/forecast.py,
#   broker/redis/link.py, broker/redis/schedules.py, broker/cluster/snapshots.py:
#                           tests replace functions of these modules to fail or
#                           count calls, which compiled callers would not see
#   broker/shards/link.py   its Connection is an asyncio.Protocol, a class
#                           from outside the build a native class cannot extend
#   broker/shards/supervisor.py, layout.py: the node's process and start-up
# Not tried compiled yet (per request or per run, no reason known against):
# the rest of broker/schedules/ (file.py, params.py, api.py, metrics.py), of
# broker/redis/ (the Redis backend: its requests wait on Redis round trips),
# broker/push/, broker/flow/, broker/jobs/ (a call's own work, or a job's slice,
# not a message's),
# broker/http/ health.py, scrape.py, sessions.py, descriptors.py,
# broker/cluster/ and replication/ (the cluster's request path and pysyncobj's
# thread).
COMPILED = [
    "storage/applying.py",
    "storage/checkpoint.py",
    "storage/commit_log.py",
    "storage/config.py",
    "storage/delay_index.py",
    "storage/delay_log.py",
    "storage/disk_room.py",
    "storage/end_index.py",
    "storage/entry.py",
    "storage/files.py",
    "storage/fileutil.py",
    "storage/framing.py",
    "storage/hour.py",
    "storage/hour_files.py",
    "storage/hour_table.py",
    "storage/id_index.py",
    "storage/key_index.py",
    "storage/pending.py",
    "storage/placement.py",
    "storage/reading.py",
    "storage/records.py",
    "storage/recovery.py",
    "storage/refile.py",
    "storage/retention.py",
    "storage/second_table.py",
    "storage/spans.py",
    "storage/store.py",
    "storage/types.py",
    "wheel/clock.py",
    "wheel/delay_queue.py",
    "wheel/driver.py",
    "wheel/scheduler.py",
    "wheel/source.py",
    "wheel/tick_state.py",
    "wheel/timing_wheel.py",
    "wheel/window.py",
    "broker/backend.py",
    "broker/clock.py",
    "broker/node/config.py",
    "broker/core/bodies.py",
    "broker/core/delay_msg.py",
    "broker/core/leases.py",
    "broker/core/lifecycle.py",
    "broker/core/long_polls.py",
    "broker/core/params.py",
    "broker/core/trace_context.py",
    "broker/core/transitions.py",
    "broker/core/turns.py",
    "broker/disk/backend.py",
    "broker/disk/dead_letters.py",
    "broker/disk/filing.py",
    "broker/disk/group_commit.py",
    "broker/disk/journal.py",
    "broker/disk/messages.py",
    "broker/disk/ready.py",
    "broker/disk/requests.py",
    "broker/disk/span_moves.py",
    "broker/disk/timers.py",
    "broker/disk/topics.py",
    "broker/disk/windows.py",
    "broker/http/api.py",
    "broker/http/commands.py",
    "broker/http/gate.py",
    "broker/http/http_types.py",
    "broker/http/httpd.py",
    "broker/observe/metrics.py",
    "broker/retry.py",
    "broker/schedules/checks.py",
    "broker/schedules/keeper.py",
    "broker/shards/placement.py",
    "broker/shards/backend.py",
    "broker/shards/router.py",
    "broker/shards/views.py",
]


def mypyc_requested() -> bool:
    return os.environ.get("HOURGLASS_MYPYC", "") == "1"


def mypyc_extensions() -> list[Extension]:
    """The compiled modules' extensions, or none: not asked for, or mypyc not
    yet installed (setuptools runs this file once to learn the build
    requirements, to which the backend then adds mypy; its build_wheel
    refuses to go on without mypyc)."""
    if not mypyc_requested():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    # mypyc's C in a fresh folder each build (relative: setuptools refuses
    # absolute source paths), so that no module compiled by an earlier
    # build, from an older list or source, can be picked up
    os.makedirs("build", exist_ok=True)
    scratch = os.path.relpath(tempfile.mkdtemp(prefix="mypyc-", dir="build"))
    atexit.register(shutil.rmtree, scratch, True)
    # One group (one library: calls between the modules stay direct C
    # calls) written as one C file a module (`multi_file`), which
    # ParallelBuildExt compiles on every core: as one C file of 75 MB, one
    # compiler process took some 8 minutes over it. docs/dependencies.md,
    # "mypyc", has the build times and the A/B of the CPU a message.
    return list(mypycify(COMPILED, opt_level="3", group_name="hourglass", multi_file=True, target_dir=scratch))


class ParallelBuildExt(build_ext):
    """setuptools' build_ext, compiling an extension's C files side by side,
    one compiler process a core (setuptools' own `parallel` only builds
    separate extensions side by side; the compiled build is one)."""

    def build_extensions(self) -> None:
        compile_files = self.compiler.compile
        jobs = os.cpu_count() or 1

        def compile_side_by_side(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                objects = pool.map(lambda source: compile_files([source], *args, **kwargs), sources)
                return [name for one in objects for name in one]

        self.compiler.compile = compile_side_by_side
        super().build_extensions()


def build_options() -> dict[str, dict[str, str]]:
    """setuptools' build folders: under a fresh temporary folder when
    compiling (see mypyc_extensions), the default `build/` otherwise."""
    if not mypyc_requested():
        return {}
    scratch = tempfile.mkdtemp(prefix="hourglass-build-")
    atexit.register(shutil.rmtree, scratch, True)
    return {"build": {"build_base": scratch}}


setup(ext_modules=mypyc_extensions(), options=build_options(), cmdclass={"build_ext": ParallelBuildExt})
