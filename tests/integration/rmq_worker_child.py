"""One RMQ worker process for tests/integration/test_rmq_workers.py: owns
slots of a FIXED_TIME topic by lease, pops on and on, and handles each
message in a task of its own, side by side: logs "start|key|worker|ms" and "end|key|worker|ms" around
a short piece of work into the Redis list `log`, acks; sweeps ack
timeouts; until killed.

    python rmq_worker_child.py REDIS_URL TOPIC WORKER_ID LEASE_MS WORK_MS
"""

from __future__ import annotations

import asyncio
import sys
import time

from broker.redis.rmq import Kind, RmqConfig, RmqTopic


async def main(url: str, topic_name: str, worker_id: str, lease_ms: int, work_ms: int) -> None:
    topic = await RmqTopic.connect(url, topic_name, Kind.FIXED_TIME, RmqConfig(slots=8, ack_timeout_ms=1500,
                                                                              sweep_ms=200))
    worker = topic.worker(worker_id, lease_ms=lease_ms)
    beats = asyncio.create_task(worker.run())
    sweeper = asyncio.create_task(topic.sweep_timeouts_forever())
    await topic.redis.rpush("ready", worker_id)
    async def handle(message) -> None:
        await topic.redis.rpush("log", f"start|{message.key}|{worker_id}|{int(time.time() * 1000)}")
        await asyncio.sleep(work_ms / 1000)
        await topic.redis.rpush("log", f"end|{message.key}|{worker_id}|{int(time.time() * 1000)}")
        await worker.ack(message.id)

    running: set[asyncio.Task] = set()
    while True:  # handled side by side, popping on meanwhile: the worker's slot rule keeps a key's apart
        for message in await worker.pop(count=8, wait_ms=50):
            task = asyncio.create_task(handle(message))
            running.add(task)
            task.add_done_callback(running.discard)
        await topic.redis.set(f"owned:{worker_id}", ",".join(map(str, sorted(worker.owned))))
        if beats.done() or sweeper.done():
            raise SystemExit(f"a task ended: {beats!r} {sweeper!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
