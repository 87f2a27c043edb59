"""Push delivery (docs/api.md, "Push delivery"): each subscription's due
messages POSTed to its URL.

    rules.py   what a subscription is, --push-allow, signing, the backoff: pure
    client.py  the pushers' HTTP client, keep-alive, parsed by llhttp
    pusher.py  Pushers: one TopicPusher per subscription, over any Backend
    api.py     subscribe, unsubscribe, getSubscription (the endpoints)

It imports storage, wheel, broker.core, broker.observe, broker.backend
and broker.http (descriptors, the endpoints' answers). The nodes, the
cluster and broker.node.config import it.
"""
