"""A node, whichever its kind, and the process around it.

    base.py        `NodeBase`: what every kind of node serves the same way
    standalone.py  the nodes that run alone: `DiskNode` (a data directory,
                   or one shard of a node of many), `RedisNode`
    cluster.py     `ClusterNode`: one node of a cluster, put together from
                   broker.cluster's parts
    config.py      the settings of `hourglass serve`
    server.py      the process: builds the node of its kind, runs it, stops it
"""
