"""How cluster peers prove the cluster secret to each other over HTTP.

Every call to /_cluster/* carries `X-Hourglass-Peer: <proof>`, where the
proof is HMAC-SHA256(secret, "hourglass cluster peer") in hex: a node
that knows the secret computes it, a client (which holds at most the
API token) cannot, and the secret itself never crosses the wire (it is
also the Raft port's encryption password, see replication.election).
Compared in constant time. With --insecure-cluster (no secret) there is
no proof: /_cluster/* then takes what the API takes (the client token
with --auth-token-file, else anyone).

The proof is the same on every call, like a bearer token: anyone who can
read the traffic between nodes can replay it. Run a cluster across
machines on a private network, or behind TLS (docs/security.md, "The
cluster secret").
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Hourglass-Peer"


def proof(secret: str) -> str:
    return hmac.new(secret.encode(), b"hourglass cluster peer", hashlib.sha256).hexdigest()


def headers(secret: str | None, token: str | None = None) -> dict[str, str]:
    """What a peer call sends: the proof; without a secret, the client
    token if there is one (the API's check then guards /_cluster/*)."""
    if secret is not None:
        return {HEADER: proof(secret)}
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def is_peer(secret: str, given: str | None) -> bool:
    """Whether a call with header value `given` comes from a peer."""
    return given is not None and hmac.compare_digest(given.encode("latin-1", "replace"), proof(secret).encode())
