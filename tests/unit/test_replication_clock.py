"""Nothing in replication/ reads the system clock or waits on its own:
every reading and wait goes through the injected wheel.clock.Clock."""

import pathlib
import re

REPLICATION = pathlib.Path(__file__).resolve().parents[2] / "replication"
# Reading a clock, and waiting on the event loop's own (asyncio.sleep and
# wait_for, loop.call_later): the injected clock has all of these.
CLOCK_USES = re.compile(r"\btime\.\w+|\bimport time\b|\bfrom time\b|\bdatetime\b|\bdate\.today\b"
                        r"|\.now\(|\.utcnow\(|\bloop\.time\(|\.time\(\)"
                        r"|\basyncio\.(sleep|wait_for|timeout)\b|\.call_later\(|\.call_at\(")


def test_no_module_in_replication_reads_the_system_clock():
    offenders = []
    for path in sorted(REPLICATION.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CLOCK_USES.search(code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []
    assert len(list(REPLICATION.glob("*.py"))) >= 8
