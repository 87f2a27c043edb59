"""The broker: the HTTP API, both backends, the features, the nodes and the
process (docs/internals.md, "Where the code is", maps the rooms below and
the one way they import).

    core/       what a request is and the rules it follows
    observe/    metrics, camellia's monitoring, spans
    backend.py  the protocol both backends meet
    disk/       the disk broker          redis/     the Redis backend
    http/       the HTTP front and camellia's API
    schedules/  recurring schedules      push/      push delivery
    console/    the built-in console
    flow/, jobs/, shards/, transfer/              topic flow, re-drive jobs, shards, moves
    node/, cluster/                               the nodes and the process
    cli.py                                        `hourglass`
    client.py, spark.py, retry.py                 the clients
    clock.py, build_info.py                       the clock; which build runs
"""
