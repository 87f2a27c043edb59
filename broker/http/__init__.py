"""The HTTP front and camellia's API over it: how a request is read,
admitted, routed and answered (docs/api.md, docs/security.md).

    httpd.py        the HTTP/1.1 server on asyncio's Protocol
    gate.py         what is decided on a request's head, before its body
    commands.py     the command table: every (method, path), its handler, cap and auth
    http_types.py   a request, its answer, a handler's type
    paths.py        the API's URL paths (the clients use them too)
    sessions.py     the console's sessions, checked by the gate and the API
                    (here, not in broker.console, because the front checks them)
    api.py          camellia's endpoints over a broker.backend.Backend, and
                    `answer`, which the features' endpoints share
    health.py       camellia's health switch
    scrape.py       one GET /metrics answer of any node
    descriptors.py  how many connections the process may hold

It imports storage, wheel, broker.core, broker.observe and
broker.backend. The features (broker.schedules, broker.push,
broker.console), the nodes and the cluster import it; it imports none of them.
"""
