"""broker.observe.tracing: which OTEL_* variables turn spans on; and the spans a
real node (in process, the real HTTP front over loopback, a real push
subscriber) emits through the OpenTelemetry SDK's InMemorySpanExporter: a
send's span the child of the context the sender gave, each delivery's
(a pull's, a push's) a root of its own *linked* to that context, never its
child. Without spans asked for, a node that served a send and a pull has
loaded no module of OpenTelemetry (checked in a fresh process)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from broker.http.paths import PREFIX
from broker.node.config import ServeConfig
from broker.observe import tracing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE"


@pytest.mark.parametrize(("environ", "exporters"), [
    ({}, ()),
    ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
    ({"OTEL_TRACES_EXPORTER": " otlp , Console,otlp"}, ("otlp", "console")),
    ({"OTEL_TRACES_EXPORTER": "none"}, ()),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, ()),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, ()),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, ("console",)),
])
def test_the_otel_variables_that_turn_spans_on(environ, exporters):
    assert tracing.exporters_from_env(environ) == exporters


def test_start_loads_named_exporters_and_skips_unknown_ones(caplog):
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    with caplog.at_level(logging.WARNING, "hourglass.tracing"):
        assert tracing.start(("no-such-exporter",)) is None
    assert "no span exporter 'no-such-exporter'" in caplog.text
    spans = tracing.start(("console",))
    assert isinstance(spans, tracing.TraceSpans)
    assert spans.provider.resource.attributes["service.name"] == "hourglass"
    spans.provider.shutdown()


def test_start_without_the_extra_warns_and_serves_without_spans(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)  # as if not installed
    with caplog.at_level(logging.WARNING, "hourglass.tracing"):
        assert tracing.start(("console",)) is None
    assert "pip install 'hourglass[otel]'" in caplog.text


def test_a_node_without_spans_loads_no_opentelemetry(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, json, sys, urllib.parse
        sys.path.insert(0, {ROOT!r})
        from broker.node.config import ServeConfig
        from broker.node.standalone import DiskNode

        async def call(port, path, **params):
            body = urllib.parse.urlencode(params).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write((f"POST {PREFIX}{{path}} HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n"
                          f"Content-Type: application/x-www-form-urlencoded\\r\\n"
                          f"Content-Length: {{len(body)}}\\r\\n\\r\\n").encode() + body)
            answer = await reader.read()
            writer.close()
            return json.loads(answer.partition(b"\\r\\n\\r\\n")[2])

        async def main():
            node = DiskNode(ServeConfig(data_dir={str(tmp_path / "data")!r}, port=0))
            node.broker.start()
            server = await node.serve("test")
            sent = await call(server.port, "sendMsg", topic="t", msg="m", traceparent={TRACEPARENT!r})
            pulled = await call(server.port, "pullMsg", topic="t")
            await server.close(1)
            await node.broker.stop()
            node.store.close()
            print(json.dumps([sent["delayMsg"]["traceparent"], pulled["delayMsgList"][0]["traceparent"],
                              node.spans is None, sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))

        asyncio.run(main())
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=environ,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [TRACEPARENT, TRACEPARENT, True, []]


async def _post(port: int, path: str, params: dict[str, object], headers: dict[str, str] | None = None) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{port}{PREFIX}{path}", data={k: str(v) for k, v in params.items()},
            headers=headers or {}) as answer:
        return json.loads(await answer.read())


def test_send_pull_and_push_spans_link_to_the_stored_context(tmp_path):
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from aiohttp import web
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from broker.node.standalone import DiskNode

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = tracing.TraceSpans(provider)
    pushed: list[dict[str, str]] = []

    async def main() -> None:
        got = asyncio.Event()

        async def hook(request: web.Request) -> web.Response:
            pushed.append(dict(request.headers))
            got.set()
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        hook_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        node = DiskNode(ServeConfig(data_dir=str(tmp_path / "data"), port=0, push_allow=("127.0.0.1",)))
        node.api.spans = spans  # as the OTEL_* variables would have it, to an in-memory exporter
        assert node.features.pushers is not None
        node.features.pushers.spans = spans
        node.broker.start()
        node.features.pushers.start(node.broker)
        server = await node.serve("test")
        try:
            port = server.port
            sent = await _post(port, "sendMsg", {"topic": "pulled", "msg": "m", "msgId": "a"},
                               {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
            assert sent["delayMsg"]["traceparent"] == TRACEPARENT
            await _post(port, "sendMsg", {"topic": "pulled", "msg": "m", "msgId": "plain"})
            pulled = await _post(port, "pullMsg", {"topic": "pulled", "batch": 10})
            assert sorted(m["msgId"] for m in pulled["delayMsgList"]) == ["a", "plain"]
            answer = await _post(port, "subscribe", {"topic": "pushed", "url": f"http://127.0.0.1:{hook_port}/hook"})
            assert answer["code"] == 200, answer
            await _post(port, "sendMsg", {"topic": "pushed", "msg": "m", "msgId": "p", "traceparent": TRACEPARENT})
            await asyncio.wait_for(got.wait(), 10)
            for _ in range(200):  # the push span ends once the subscriber's answer is read
                if any(s.name == "push pushed" for s in exporter.get_finished_spans()):
                    break
                await asyncio.sleep(0.01)
        finally:
            await node.features.pushers.stop()
            await server.close(1)
            await node.broker.stop()
            node.store.close()
            await runner.cleanup()

    asyncio.run(main())
    assert pushed[0]["traceparent"] == TRACEPARENT and "tracestate" not in pushed[0]
    finished = {(s.name, s.attributes["messaging.message.id"]): s for s in exporter.get_finished_spans()}
    assert set(finished) == {("send pulled", "a"), ("send pulled", "plain"), ("receive pulled", "a"),
                             ("receive pulled", "plain"), ("send pushed", "p"), ("push pushed", "p")}
    stored = int(TRACE_ID, 16)

    send = finished["send pulled", "a"]  # the sender's child
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.trace_id == stored and send.parent.span_id == 0x00f067aa0ba902b7
    assert send.context.trace_id == stored and not send.links
    assert send.attributes["messaging.destination.name"] == "pulled"
    plain_send = finished["send pulled", "plain"]
    assert plain_send.parent is None and plain_send.context.trace_id != stored

    for key in (("receive pulled", "a"), ("push pushed", "p")):  # linked, never a child
        delivery = finished[key]
        assert delivery.kind is SpanKind.CONSUMER
        assert delivery.parent is None and delivery.context.trace_id != stored
        link, = delivery.links
        assert (link.context.trace_id, link.context.span_id) == (stored, 0x00f067aa0ba902b7)
    assert dict(finished["receive pulled", "a"].links[0].context.trace_state) == {"congo": "t61rcWkgMzE"}
    assert finished["receive pulled", "plain"].parent is None and not finished["receive pulled", "plain"].links
    push = finished["push pushed", "p"]
    assert push.attributes["http.response.status_code"] == 200 and push.status.is_ok
    provider.shutdown()
