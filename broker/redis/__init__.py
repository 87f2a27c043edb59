"""Everything hourglass keeps in Redis, apart from the disk broker.

    backend.py  RedisBroker: docs/api.md's Semantics in Redis, the HTTP API's
                second backend (`hourglass serve --backend redis://...`)
    keys.py     its configuration, key names and URL
    link.py     what its parts share: the client, the scripts, the wakes
    requests.py its requests: send, pull, ack ... (one script each)
    bulk.py     its bulk calls: listMsg, deleteMsgs, rescheduleMsgs
    shards.py   sharded queues, the ground dyno.py and rmq.py stand on
    dyno.py     Netflix Dyno-queues' push/pop/ack/unack interface
    rmq.py      RMQ's three message kinds
    scripts.py  loads the Lua scripts of lua/<family>/*.lua

The package needs the `redis` extra; nothing outside it imports it except
where `--backend redis://` is chosen (broker.node.standalone.RedisNode), so the disk
broker runs without it.
"""
