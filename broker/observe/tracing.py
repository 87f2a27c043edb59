"""Spans of sends and deliveries through OpenTelemetry, when the optional
`otel` extra is installed and the standard OTEL_* variables ask for them
(docs/operations.md, "Traces"). Nothing here imports OpenTelemetry until
`start` is called, and nothing calls it unless spans are asked for: a node
without them loads no module of it and its requests make no call more
(the API and the pushers test `spans is not None`, an attribute).

    the switch (read by the CLI, `exporters_from_env`)
      OTEL_TRACES_EXPORTER=console|otlp|...   spans on, to those exporters
                                              (a comma list; "none": off)
      OTEL_EXPORTER_OTLP_ENDPOINT or
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT      spans on, to "otlp" (when
                                              OTEL_TRACES_EXPORTER is unset)
      OTEL_SDK_DISABLED=true                  off, whatever else is set

An exporter is the `opentelemetry_traces_exporter` entry point of its name
(opentelemetry-sdk has console; opentelemetry-exporter-otlp has otlp,
otlp_proto_grpc and otlp_proto_http), built with no argument, so it reads
its own OTEL_EXPORTER_* variables, behind a BatchSpanProcessor. The
TracerProvider reads OTEL_SERVICE_NAME (default here: hourglass),
OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER as the SDK does.

The spans, one per message (the messaging conventions' names):

    send <topic>     PRODUCER  sendMsg and sendMsgBatch: from the request's
                               time to the answer (the message durable);
                               a child of the context the sender gave
                               (docs/api.md, "Trace context"), else a root
    receive <topic>  CONSUMER  each message a pullMsg or longPollingMsg
                               answers; a root of its own, LINKED to the
                               stored context, never its child
    push <topic>     CONSUMER  each POST of a push delivery, from its start
                               to the subscriber's answer (an error status
                               when it failed); a root LINKED to the stored
                               context

A delivery is a child of no sender: a message delivered an hour (or a
month) after its send, or redelivered ten times, would otherwise stretch
the sender's trace over all of it (a trace per delivery, linked to the
send, is what the consumers of a delay queue read).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from storage.entry import Message

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("hourglass.tracing")

EXPORTER_VARIABLE = "OTEL_TRACES_EXPORTER"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DISABLED_VARIABLE = "OTEL_SDK_DISABLED"
EXPORTER_GROUP = "opentelemetry_traces_exporter"
SYSTEM = "hourglass"  # messaging.system


class Spans(Protocol):
    """What the API and the pushers tell of the messages they handle."""

    def sent(self, messages: Sequence[Message], start_ms: int) -> None:
        """Messages a send stored (or answered as duplicates), its request
        taken at `start_ms`."""

    def received(self, messages: Sequence[Message]) -> None:
        """Messages a pull or long poll answers."""

    def push_started(self, message: Message) -> object:
        """A push POST of `message` begins: a handle for `push_ended`."""

    def push_ended(self, handle: object, failure: str | None, status: int | None) -> None:
        """That POST ended: None, or the reason it failed; the HTTP status if one came."""


def exporters_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters the OTEL_* variables ask spans for (see the module
    docstring); () when they ask for none."""
    if environ.get(DISABLED_VARIABLE, "").strip().lower() == "true":
        return ()
    named = environ.get(EXPORTER_VARIABLE)
    if named is None:
        return ("otlp",) if any(environ.get(v, "").strip() for v in ENDPOINT_VARIABLES) else ()
    return tuple(dict.fromkeys(n for n in (part.strip().lower() for part in named.split(","))
                               if n and n != "none"))


def start(exporters: Sequence[str]) -> TraceSpans | None:
    """Spans exported to `exporters` (entry points of EXPORTER_GROUP), or
    None, with a warning, when the `otel` extra is not installed or none
    of them can be loaded: a node that cannot trace still serves."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("%s asks for spans (%s), but opentelemetry-sdk is not installed: pip install "
                    "'hourglass[otel]'; serving without spans", EXPORTER_VARIABLE, ",".join(exporters))
        return None
    from importlib.metadata import entry_points

    found = {e.name: e for e in entry_points(group=EXPORTER_GROUP)}
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SYSTEM}))
    provider = TracerProvider(resource=resource)
    added = []
    for name in exporters:
        entry = found.get(name)
        if entry is None:
            log.warning("no span exporter %r is installed (%s has: %s); skipped", name, EXPORTER_GROUP,
                        ", ".join(sorted(found)) or "none")
            continue
        provider.add_span_processor(BatchSpanProcessor(entry.load()()))
        added.append(name)
    if not added:
        return None
    log.info("spans on: each send and delivery exported to %s", ", ".join(added))
    return TraceSpans(provider)


class TraceSpans:
    """`Spans` over an OpenTelemetry SDK TracerProvider (tests hand it one
    with an in-memory exporter)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from ..build_info import version

        self.provider = provider
        self._tracer = provider.get_tracer("hourglass", version())
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._root = Context()

    def __repr__(self) -> str:
        return f"TraceSpans({self.provider!r})"

    def sent(self, messages: Sequence[Message], start_ms: int) -> None:
        producer = self._trace.SpanKind.PRODUCER
        for m in messages:
            parent = self._context(m) if m.traceparent else self._root
            self._tracer.start_span(f"send {m.topic}", parent, producer, self._attributes(m, "send"),
                                    start_time=start_ms * 1_000_000).end()

    def received(self, messages: Sequence[Message]) -> None:
        consumer = self._trace.SpanKind.CONSUMER
        for m in messages:
            self._tracer.start_span(f"receive {m.topic}", self._root, consumer, self._attributes(m, "receive"),
                                    self._links(m)).end()

    def push_started(self, message: Message) -> object:
        return self._tracer.start_span(f"push {message.topic}", self._root, self._trace.SpanKind.CONSUMER,
                                       self._attributes(message, "push"), self._links(message))

    def push_ended(self, handle: object, failure: str | None, status: int | None) -> None:
        span: Any = handle
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if failure is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, failure))
        span.end()

    def _context(self, m: Message) -> Any:
        """The sender's context stored with `m`, as a remote parent."""
        carrier = {"traceparent": m.traceparent}
        if m.tracestate:
            carrier["tracestate"] = m.tracestate
        return self._propagator.extract(carrier, self._root)

    def _links(self, m: Message) -> list[Any]:
        if not m.traceparent:
            return []
        context = self._trace.get_current_span(self._context(m)).get_span_context()
        return [self._trace.Link(context)] if context.is_valid else []

    @staticmethod
    def _attributes(m: Message, operation: str) -> dict[str, str | int]:
        return {"messaging.system": SYSTEM, "messaging.operation.name": operation,
                "messaging.operation.type": "send" if operation == "send" else "receive",
                "messaging.destination.name": m.topic, "messaging.message.id": m.msg_id,
                "hourglass.retry": m.retry}
