"""What every kind of node serves the same way, whether it runs alone
(broker.server) or in a cluster (broker.cluster): camellia's online switch
over the API's calls and the /health answer of a node taken offline
(/metrics: broker.scrape)."""

from __future__ import annotations

from .api import answer
from .config import ServeConfig
from .health import ServingStatus
from .httpd import Response
from .paths import PREFIX


def serving_status(config: ServeConfig, wake_long_polls) -> ServingStatus:
    """camellia's online/offline switch (broker.health) over the API's calls."""
    return ServingStatus(config.offline_idle_s, PREFIX, on_offline=wake_long_polls)


def offline_health(role: str, **extra) -> Response:
    """/health of a node taken offline (/camellia/health/offline): not
    ready for a load balancer, though it still serves what reaches it."""
    return answer(503, "offline (/camellia/health/online brings it back)", status="offline", role=role, **extra)

