"""What a node tells of itself: its counters, camellia's monitoring, and spans.

    metrics.py           counters and histograms of one node (GET /metrics)
    camellia_metrics.py  camellia's metric names and getMonitorString's JSON
    tracing.py           spans of sends and deliveries through OpenTelemetry

It imports storage, broker.core (metrics counts transitions' effects) and
broker.build_info (the version a span and /metrics name). Every serving
room (broker.disk, broker.redis, broker.http, the features) imports it.
"""
