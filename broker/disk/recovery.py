"""What a restarted disk broker holds in RAM, rebuilt from the store without
reading the backlog.

    CONSUMING  from the store's in-flight set (kept in its checkpoint,
               bounded by the in-flight cap), each with its own ack
               deadline, capped at the default ack timeout from the restart
    READY      each topic holding some starts spilled from its first hour
               holding any: its window refills as consumers pull
    WAITING    nothing: the wheel reads them back from its tick

`recover` is a step on built parts: the ready windows and their timers
exist, the tasks have not started (broker.disk.backend builds the parts,
runs it, then `start()` launches the tasks).
"""

from __future__ import annotations

import logging

from storage.entry import Location, Status
from storage.store import Store

from .windows import ReadyWindows

log = logging.getLogger("hourglass.service")


def recover(store: Store, windows: ReadyWindows, ack_timeout_ms: int, now_ms: int) -> None:
    """Put CONSUMING messages back in `windows` with their deadlines (no
    scan), and mark every topic with READY messages on disk spilled from
    its first hour holding any."""
    fresh_ms = now_ms + ack_timeout_ms
    held = 0
    for location, (deadline_ms, delivery) in store.consuming().items():
        message = store.read_message(location)
        if message is None or message.status is not Status.CONSUMING:
            continue
        # its own deadline if its pull's record gave one, capped by the default
        # timeout; its hand-over's delivery, so its holder's fenced calls still match
        windows.hold_consuming(message, min(deadline_ms or fresh_ms, fresh_ms), delivery)
        held += 1
    names = store.topic_names()
    spilled = 0
    for topic_hash, hour in store.first_hours(Status.READY).items():
        name = names.get(topic_hash)
        if name is not None:
            windows.spilled_from(name, Location(hour, 0))
            spilled += 1
    if held or spilled:
        log.info("recovered %d consuming messages; %d topics hold ready messages on disk", held, spilled)
