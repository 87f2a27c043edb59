"""The wheel's tick: persisted only past releases that are durable.

The wheel's position (wheel.tick_state) is written only past releases that
are durable, and never past a message not yet handed to the wheel
(broker.disk.filing): a restart starts the wheel from the tick and must
find every message not yet released. The releases themselves (WAITING ->
READY, broker.core.transitions' `Release`) are broker.disk.messages'
`release`, which the wheel's driver (wheel.WheelDriver) hands its due
entries to; it then asks `persist_tick` here.
"""

from __future__ import annotations

from wheel.tick_state import TickState, TickStateFile

from .filing import Filing
from .journal import Journal


class TickKeeper:
    """Persists the wheel's tick. Runs on the event loop; the tick file is
    this part's to write and close."""

    def __init__(self, journal: Journal, filing: Filing, tick_file: TickStateFile) -> None:
        self._journal = journal
        self._filing = filing
        self._tick_file = tick_file

    def __repr__(self) -> str:
        return f"TickKeeper(tick={self._tick_file.state}, {self._filing!r})"

    @property
    def tick(self) -> TickState | None:
        """The tick last persisted: what a follower may take over from."""
        return self._tick_file.state

    async def persist_tick(self, tick: TickState) -> None:
        """The tick moves only past releases that are durable, and never past
        a message still in its group commit (a slow fsync can outlast the
        scheduler's commit lag): a restart must read that message's second.
        Releases a quorum did not acknowledge in time leave the file as it
        was (a restart re-reads their seconds: at least once)."""
        if not await self._journal.background_durable("released messages"):
            return
        self._tick_file.write(self._filing.cap(tick))

    def close(self) -> None:
        self._tick_file.close()
