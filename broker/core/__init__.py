"""What a request is and the rules it follows, shared by both backends
(the disk broker, broker.disk; Redis, broker.redis), the HTTP API
(broker.http) and the features above it.

    params.py         a request's parameters: bytes in, a typed request out
    bulk_params.py    the bulk calls' parameters, filter, page order and cursor
    bodies.py         what a request body may cost to decode
    trace_context.py  the traceparent and tracestate a send may carry
    transitions.py    a message's lifecycle as a pure step function
    lifecycle.py      a backend's serving life: serving, stopping, failed
    long_polls.py     pulls waiting on their topic, woken by a READY message
    recurrence.py     recurring schedules' time rules (cron, every, misfire),
                      here because a message's answer names the run it is
    redact.py         what a client is told of an internal error

It imports storage and wheel only, and no other module of broker/: every
room of broker/ may import it.
"""
