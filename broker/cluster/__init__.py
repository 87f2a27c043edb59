"""A cluster node (`ClusterNode`): its roles, the moves between them, and failover.

Roles (GET /health says leader or follower; a candidate is shown as follower):

    follower ──Raft elects it in term T──► candidate ──claim committed──► leader
       ▲                                        │                           │
       └──────── no majority / claim fails ─────┘                           │
       └── Raft term moves on, a follower knows a higher epoch, SIGTERM ────┘

Becoming leader of term T, in order (decided by replication.roles.step,
carried out by role_loop, step 4 by lead):
  1. promise T to itself, then ask every peer for its promise and log
     position (POST /_cluster/position); a majority must answer. A peer
     that promised T takes no record of an older epoch from then on, so
     the old leader can no longer reach a quorum;
  2. catch up: if a peer of the majority has a longer log in a later or
     equal epoch, fetch the difference from it (or a snapshot, if this
     node's tail diverged) -- every record a quorum acknowledged is on at
     least one node of any majority;
  3. replicate claim(T) through Raft; committed means a majority accepted
     term T;
  4. record epoch T from the current log end, open the broker on the
     store (READY/CONSUMING rebuilt from the on-disk status counts) with
     its wheel starting from the tick state the old leader streamed
     (fast-forward if behind the clock, wait if ahead), and serve.

A leader stands down when Raft moves to another term or
leader, when a follower's fetch shows a higher epoch, or when a write
cannot reach its quorum: requests waiting for followers are answered 503
(the client retries them, with the same msgId, on the next leader). Its
log may end with records no quorum has: it rejoins as a follower, the
leader answers its fetch with "diverged", and it takes a snapshot.

SIGTERM on the leader is a graceful handover: stop taking requests, stop
the wheel (its tick persisted), wait until the followers have fetched
everything and the last tick, then leave the Raft group; the next leader
starts exactly where this one stopped, so nothing is released twice.

Any node answers any call: a follower forwards API requests to the leader
(503 naming no leader while none is known).

The node is one class, built of parts it holds, on the base every node
shares (broker.node.base: clock, metrics, health switch, API, console, the
HTTP app, /health and /metrics). Its state is one object every part is
given; each part is given too the parts it calls, and no others:

    node.py         building it: store, epochs, tick file, election, the
                    state and the parts; closing it
    state.py        the state the parts share (store, epochs, role, the
                    broker while leading, the follower), each field
                    written by one part; the known leader; failure
    peer_client.py  the calls this node makes of its peers (/_cluster/*)
    routes.py       what its HTTP app holds of its own: API calls served
                    while leading or forwarded to the leader, the peer
                    proof, its role in /health, /metrics and the console
    peers.py        this node's answers to its peers' /_cluster/* calls
    role_loop.py    the driver of replication.roles: following, trying to
                    lead, standing down, stopping
    lead.py         what runs while it leads: the broker started, stood
                    down, or handed over on SIGTERM
    snapshots.py    making, fetching and installing snapshots; checkpoints
"""
