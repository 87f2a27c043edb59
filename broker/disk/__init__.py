"""The disk broker: one node's queues over the disk store (storage) and the
timing wheel (wheel), a broker.backend.Backend beside broker.redis's.

    backend.py       Broker: builds the parts below, serves as a Backend, persists the tick
    requests.py      send, pull, long poll, ack, nack, delete, get
    bulk.py          listMsg, deleteMsgs, rescheduleMsgs
    dead_letters.py  rescheduleMsg, listDeadMsg, redriveMsg
    messages.py      the one part that steps a message (broker.core.transitions)
                     and carries the step out: the three above sit over it
    topics.py        its topics, the --max-topics cap, their backlogs
    windows.py       what RAM holds of READY and CONSUMING messages, refilled from disk
    ready.py         one topic's window, and the limits on all of them
    timers.py        ack deadlines and expiries of the messages RAM holds
    filing.py        stored WAITING messages on their way to the wheel
    span_moves.py    far-future spans' messages moved to nearer files
    journal.py       its writes to the commit log, awaited durable
    group_commit.py  many requests' records made durable by one fsync
    syncer.py        the thread that runs those fsyncs
    recovery.py      what a restarted broker holds in RAM

It imports storage, wheel, broker.core, broker.observe and broker.backend,
nothing of the HTTP front. The nodes (broker.node.standalone, broker.cluster) build
it; broker.redis and broker.node.config take its limits (ready.QueueLimits).
"""
