"""Shards: a node that uses every core (docs/internals.md, "Shards").

`hourglass serve --shards N` runs N shard processes over one public port,
each today's whole engine over its own store in `DATA/shard-<i>/`. A
message lives on the shard its msgId names (its key's, when it has one);
every shard takes connections on the public port (SO_REUSEPORT) and serves
what it owns itself, forwards the rest to its owner in one hop over a local
socket, serves pulls from its own due messages first and then the others',
and merges the node's views.

    placement   which shard owns a msgId, a key, a schedule (a stable hash)
    layout      the shard count a data directory keeps, and each shard's place
    link        the local sockets between shards: framed, pipelined calls
    router      a shard's side: its links, the calls it answers, the commands
                routed as each declares where it runs (broker.http.commands)
    backend     the node's Backend on a shard: what it forwards and fans out
    views       what crosses the links, and how the shards' views merge
    answers     how every shard's answer to a command becomes one
    budgets     the node's caps and windows, each shard's share
    rates       a topic's releaseRate, a job's rate: shares moved by demand
    connections --max-connections over the shards: one board they all count on
    supervisor  the process around the shards: the port, start, restart, stop

It may call broker.core, broker.http and broker.disk's public parts; no
engine part calls it back but through the hooks it is handed (a long
poll's wake, a command's handler).
"""
