"""broker.node.features: a node's features attached to a broker's run,
started and stopped, over the records its kind keeps -- here a standalone
node's files (DiskRecords), on a real store. A second run (as a cluster
leader's next term) reads its schedules and jobs afresh from the records."""

import asyncio

from broker.core.params import Defaults
from broker.node.config import ServeConfig
from broker.node.features import Features
from broker.node.standalone import DiskNode, DiskRecords
from broker.schedules.params import parse_put_schedule


class Counted(DiskRecords):
    """DiskRecords that count what is asked of them."""

    def __init__(self, config: ServeConfig) -> None:
        super().__init__(config)
        self.asked: list[str] = []

    def schedules(self):  # type: ignore[no-untyped-def]
        self.asked.append("schedules")
        return super().schedules()

    def jobs(self):  # type: ignore[no-untyped-def]
        self.asked.append("jobs")
        return super().jobs()


def test_a_runs_features_are_attached_before_it_starts_and_gone_after_it_stops(tmp_path):
    async def main() -> None:
        node = DiskNode(ServeConfig(data_dir=str(tmp_path / "data"), port=0, push_allow=("127.0.0.1",)))
        features = node.features
        schedules, jobs, pushers = features.schedules, features.jobs, features.pushers
        assert schedules is not None and jobs is not None and pushers is not None
        # attached by the node's start: the broker's releases told to the schedules, its pauses carried out
        assert node.broker.on_release == schedules.on_release and node.broker.on_cancel == schedules.on_cancel
        assert features.flow.gate() is node.broker
        node.broker.start()
        features.start(node.broker)
        spec = parse_put_schedule({"topic": "t", "scheduleId": "s", "msg": "m", "everyMillis": "60000"},
                                  now_ms=node.clock.now_ms(), defaults=Defaults(), max_msg_bytes=1024)[0]
        await schedules.put(spec, None)
        await features.stop()
        assert features.schedules is None and features.jobs is None
        assert not pushers._running  # (the pushers stopped first)
        await node.broker.stop()
        node.store.close()

    asyncio.run(main())


def test_each_run_reads_the_schedules_and_jobs_again_from_the_records(tmp_path):
    async def main() -> None:
        config = ServeConfig(data_dir=str(tmp_path / "data"), port=0)
        node = DiskNode(config)
        await node.features.stop()  # (its own, over the same files)
        records = Counted(config)
        features = Features(config, node.clock, records, node.descriptors, None)
        features.attach(node.broker)
        node.broker.start()
        features.start(node.broker)
        assert features.schedules is not None
        spec = parse_put_schedule({"topic": "t", "scheduleId": "s", "msg": "m", "everyMillis": "60000"},
                                  now_ms=node.clock.now_ms(), defaults=Defaults(), max_msg_bytes=1024)[0]
        await features.schedules.put(spec, None)
        await features.stop()
        features.attach(node.broker)  # the next run (a cluster leader's next term)
        assert records.asked == ["schedules", "jobs", "schedules", "jobs"]
        assert features.schedules is not None and features.schedules.get("t", "s").spec.schedule_id == "s"
        await features.stop()
        await node.broker.stop()
        node.store.close()

    asyncio.run(main())
