"""redriveMsgs jobs (docs/api.md, "Re-driving by filter"): dead letters put
back by filter, at a rate, in the background, across restarts and
failovers.

    runner.py    RedriveJobs: the node's jobs, each a task of slices over the broker
    file.py      the jobs directory: each job's record on disk
    api.py       redriveMsgs, getJob, cancelJob (the endpoints); on a node
                 of shards the calls between them are broker.shards.jobs'

A cluster keeps the records in its replicated state instead
(broker.cluster.records), the Redis backend in Redis (broker.redis.jobs).
It imports storage, wheel, broker.core and broker.http; the nodes,
broker.shards and broker.redis import it.
"""
