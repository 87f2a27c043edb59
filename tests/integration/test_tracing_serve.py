"""Spans from a real `hourglass serve` turned on by the standard OTEL_*
variables alone (docs/operations.md, "Traces"): the console exporter
prints each span as JSON on the node's stdout, which the harness writes to
its log. The send's span is the sender's context's child; the delivery's
span starts a trace of its own, linked to that context (never its child)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from serving import Server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"


def spans_in(text: str) -> list[dict[str, Any]]:
    """The JSON objects holding a span (its "name" and "context") among the
    log's lines."""
    decoder = json.JSONDecoder()
    found = []
    at = text.find("{")
    while at != -1:
        try:
            obj, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        if isinstance(obj, dict) and "name" in obj and "context" in obj:
            found.append(obj)
        at = text.find("{", end)
    return found


def test_the_otel_variables_turn_spans_on_in_a_served_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "hourglass-under-test")
    log = tmp_path / "serve.log"
    server = Server.start(tmp_path / "data", log_path=log)
    try:
        code, sent = server.post("sendMsg", topic="t", msg="m", msgId="a", traceparent=TRACEPARENT)
        assert code == 200, sent
        code, pulled = server.post("pullMsg", topic="t")
        assert code == 200 and isinstance(pulled, dict)
        assert [m["traceparent"] for m in pulled["delayMsgList"]] == [TRACEPARENT]
    finally:
        assert server.stop() == 0  # SIGTERM: the provider's exit hook flushes the batch
    spans = {s["name"]: s for s in spans_in(log.read_text())}
    send, receive = spans["send t"], spans["receive t"]
    assert send["kind"] == "SpanKind.PRODUCER" and receive["kind"] == "SpanKind.CONSUMER"
    assert send["context"]["trace_id"] == "0x" + TRACE_ID and send["parent_id"] == "0x" + PARENT_SPAN
    assert receive["context"]["trace_id"] != "0x" + TRACE_ID and receive["parent_id"] is None
    assert [link["context"]["trace_id"] for link in receive["links"]] == ["0x" + TRACE_ID]
    assert [link["context"]["span_id"] for link in receive["links"]] == ["0x" + PARENT_SPAN]
    assert send["resource"]["attributes"]["service.name"] == "hourglass-under-test"
    assert send["attributes"]["messaging.message.id"] == "a"
