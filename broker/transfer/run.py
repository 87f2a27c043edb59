"""`hourglass export` and `hourglass import`, as the command line runs
them (docs/operations.md, "Moving messages"): each prints its counts as
one JSON object on stdout when done, and logs progress on stderr.

An import's `--state FILE` keeps where it is (camellia's SCAN cursor, or
the byte offset in the lines), written (renamed into place, fsynced) only
after everything before it was answered 200: a run killed anywhere and run
again with the same file goes on from there, and what it sends again is
answered as stored (`strictIdempotence`), never stored twice. A state file
of another source is refused; one that says the import finished makes the
run answer its counts and send nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

import orjson

from storage.errors import ConfigError

from ..client import DelayQueueClient
from . import lines
from .sending import Outgoing, Sender, Tally

log = logging.getLogger("hourglass.transfer")

# Lines of an import file read (and sent) between two saves of its state.
LINES_A_STEP = 20_000


@dataclass(frozen=True)
class Target:
    """The node messages go to (or come from), and how hard to push it."""

    url: str
    token: str | None
    batch: int = 500
    in_flight: int = 4
    rate: float | None = None
    timeout_s: float = 30.0

    def client(self) -> DelayQueueClient:
        return DelayQueueClient(self.url, token=self.token, timeout_s=self.timeout_s)


def _now_ms() -> int:
    return int(time.time() * 1000)


class State:
    """An import's place in its source, kept in a file (None: not kept)."""

    def __init__(self, path: str | None, source: str) -> None:
        self.path = path
        self.source = source
        self.place = 0
        self.done = False
        self.tally = Tally()
        if path is None or not os.path.exists(path):
            return
        with open(path, "rb") as f:
            kept: Any = orjson.loads(f.read())
        if kept.get("source") != source:
            raise ConfigError(f"--state {path} is of another import ({kept.get('source')!r}, not {source!r}): "
                              f"name a new file, or delete it to start over")
        self.place, self.done = int(kept["place"]), bool(kept["done"])
        counts = kept["counts"]
        self.tally.sent, self.tally.refused = int(counts["sent"]), int(counts["refused"])
        self.tally.skipped.update(counts["skipped"])

    def save(self, place: int, done: bool = False) -> None:
        self.place, self.done = place, done
        if self.path is None:
            return
        temporary = self.path + ".new"
        with open(temporary, "wb") as f:
            f.write(orjson.dumps({"source": self.source, "place": place, "done": done,
                                  "counts": self.tally.as_dict()}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


async def _importing(target: Target, state: State, dry_run: bool, rejects_path: str | None,
                     steps: Callable[[Sender | None, Tally], Awaitable[None]]) -> dict[str, object]:
    """Run an import's `steps` with a sender (None on a dry run) that adds to the state's tally."""
    started = time.monotonic()
    before = state.tally.sent
    if state.done:
        log.info("the import in %s finished before: nothing to send", state.path)
        return {**state.tally.as_dict(), "done": True, "seconds": 0.0, "perSecond": 0.0}
    if dry_run:
        tally = Tally()
        await steps(None, tally)
        return {**tally.as_dict(), "dryRun": True, "seconds": round(time.monotonic() - started, 3)}
    with contextlib.ExitStack() as stack:
        rejects: TextIO | None = None
        if rejects_path is not None:
            rejects = stack.enter_context(open(rejects_path, "a", encoding="utf-8"))  # noqa: ASYNC230 (a command's one task)
        async with target.client() as client:
            sender = Sender(client, batch=target.batch, in_flight=target.in_flight, rate=target.rate,
                            rejects=rejects, tally=state.tally)
            await steps(sender, state.tally)
    seconds = time.monotonic() - started
    sent = state.tally.sent - before
    return {**state.tally.as_dict(), "done": True, "seconds": round(seconds, 3),
            "perSecond": round(sent / seconds, 1) if seconds > 0 else 0.0}


def _count(tally: Tally, sends: list[Outgoing], skipped: Counter[str]) -> None:
    """A dry run's tally of one step."""
    tally.skipped.update(skipped)
    tally.skipped["would send"] += len(sends)


async def import_camellia(target: Target, redis_url: str, namespace: str, *, state_path: str | None = None,
                          dry_run: bool = False, rejects_path: str | None = None,
                          page: int = 1000) -> dict[str, object]:
    """Every pending message of camellia's namespace sent to the node (broker.transfer.camellia)."""
    from ..redis.keys import redact
    from .camellia import CamelliaSource

    source = CamelliaSource(redis_url, namespace, page=page)
    state = State(state_path, f"camellia {redact(redis_url)} {namespace}")

    async def steps(sender: Sender | None, tally: Tally) -> None:
        async for cursor, sends, skipped in source.pages(state.place if sender is not None else 0, _now_ms()):
            if sender is None:
                _count(tally, sends, skipped)
                continue
            await sender.send(sends)
            tally.skipped.update(skipped)
            state.save(cursor, done=cursor == 0)

    try:
        return await _importing(target, state, dry_run, rejects_path, steps)
    finally:
        await source.close()


async def import_lines(target: Target, path: str, *, state_path: str | None = None, dry_run: bool = False,
                       rejects_path: str | None = None) -> dict[str, object]:
    """Every line of an export file sent to the node (broker.transfer.lines)."""
    state = State(state_path, f"lines {os.path.abspath(path)}")  # noqa: ASYNC240 (a command's one task)

    async def steps(sender: Sender | None, tally: Tally) -> None:
        with _opened(path) as f:
            if sender is not None:
                f.seek(state.place)
            while True:
                chunk = [f.readline() for _ in range(LINES_A_STEP)]
                chunk = [line for line in chunk if line]
                if not chunk:
                    break
                now_ms = _now_ms()
                sends: list[Outgoing] = []
                skipped: Counter[str] = Counter()
                for line in chunk:
                    if not line.strip():
                        continue
                    outcome = lines.pending(line, now_ms)
                    if isinstance(outcome, str):
                        skipped[outcome] += 1
                    else:
                        sends.append(outcome)
                if sender is None:
                    _count(tally, sends, skipped)
                    continue
                await sender.send(sends)
                tally.skipped.update(skipped)
                state.save(f.tell())
            if sender is not None:
                state.save(f.tell(), done=True)

    return await _importing(target, state, dry_run, rejects_path, steps)


async def export(target: Target, out_path: str, topics: list[str]) -> dict[str, object]:
    """The node's messages (or `topics`') written to `out_path` ("-": stdout) as lines."""
    started = time.monotonic()
    async with target.client() as client:
        if out_path == "-":
            written = await lines.export(client, sys.stdout, topics)
        else:
            temporary = out_path + ".part"
            with open(temporary, "w", encoding="utf-8") as out:  # noqa: ASYNC230 (a command's one task)
                written = await lines.export(client, out, topics)
                os.fsync(out.fileno())
            os.replace(temporary, out_path)  # a file named as asked is whole
    seconds = time.monotonic() - started
    total = sum(written.values())
    return {"written": total, "topics": dict(sorted(written.items())), "seconds": round(seconds, 3),
            "perSecond": round(total / seconds, 1) if seconds > 0 else 0.0}


def _opened(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
