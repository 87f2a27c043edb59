"""Flow control of a topic's deliveries (docs/api.md, "Flow"): its
settings and its pauses -- of the whole topic or of one serial key --
durable and replicated, carried out where messages are handed out.

    settings.py  what a topic's settings and pauses are, their parameters,
                 their answers and their entries as kept: pure
    file.py      the topic settings file (a standalone node's, a shard's)
    keeper.py    TopicFlow: the node's settings, saved before answered, the
                 pauses carried out on the backend (resume's shift included)
    api.py       setTopicConfig, getTopicConfig, pauseTopic, resumeTopic

It may call broker.core and, through the PauseGate protocol, the backend
serving (the disk broker: broker.disk.windows parks what is paused); a
cluster keeps the entries in the Raft group's state (broker.cluster.records),
a Redis node in Redis (broker.redis.flow), where its scripts carry the
pauses out for every node sharing it.
"""
