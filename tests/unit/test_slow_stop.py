"""A stop that hangs says where (broker.node.server.report_slow_stop): every
task still running, by name and the innermost lines of its stack."""

from __future__ import annotations

import asyncio
import logging

from broker.node.server import report_slow_stop


async def waits_on_redis(forever: asyncio.Event) -> None:
    await forever.wait()


def test_a_slow_stop_logs_each_task_and_the_line_it_waits_on(caplog):
    async def main() -> None:
        forever = asyncio.Event()
        stuck = asyncio.create_task(waits_on_redis(forever), name="lease-renewal")
        report_slow_stop(0.01)
        await asyncio.sleep(0.1)
        stuck.cancel()

    with caplog.at_level(logging.WARNING, logger="hourglass.server"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if "still stopping" in r.getMessage()]
    assert "lease-renewal at test_slow_stop.py:" in record.getMessage()
    assert "waits_on_redis" in record.getMessage()

