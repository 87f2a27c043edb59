"""broker.push.client against raw HTTP servers on loopback (asyncio, in
this process), each answering as a test scripts it: keep-alive reuse and a
kept connection the server closed, chunked and close-delimited bodies, an
interim 100, a body past maxBodyBytes, no answer in time, a refused
connection, --push-allow at connect time (an address, a name and what it
resolves to), TLS with a certificate the system does not trust, and header
values that cannot end the head early."""

from __future__ import annotations

import asyncio
import datetime
import ssl

import pytest

from broker.push.client import PostFailed, PushClient, header_value
from broker.push.rules import PushAllow

LOCAL = PushAllow.parse(["127.0.0.1"])


class Script:
    """A server whose answer to each request is `answers[i]` (bytes, or
    None: never answer); records every request and counts connections."""

    def __init__(self, answers: list[bytes | None], close_after: bool = False) -> None:
        self.answers = answers
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0) if self.answers else b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
                if answer is None:
                    await asyncio.sleep(3600)
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(script: Script, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


def run(test):
    asyncio.run(test())


def test_connections_are_kept_alive_and_reused():
    async def test() -> None:
        script = Script([])
        server, port = await serve(script)
        client = PushClient(f"http://127.0.0.1:{port}/hook?x=1", LOCAL, 5, 1000)
        for _ in range(3):
            assert await client.post(b'{"a":1}', [("Content-Type", "application/json")]) == (200, None)
        assert script.connections == 1
        head = script.requests[0].split(b"\r\n")
        assert head[0] == b"POST /hook?x=1 HTTP/1.1" and f"Host: 127.0.0.1:{port}".encode() in head
        assert script.requests[0].endswith(b'\r\n\r\n{"a":1}')
        await client.close()
        server.close()
    run(test)


def test_a_kept_connection_the_server_closed_is_replaced_without_a_failure():
    async def test() -> None:
        script = Script([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"] * 2, close_after=True)
        server, port = await serve(script)
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 5, 1000)
        assert (await client.post(b"1", []))[0] == 200
        await asyncio.sleep(0.05)  # the server has closed it meanwhile
        assert (await client.post(b"2", []))[0] == 200
        assert script.connections == 2
        await client.close()
        server.close()
    run(test)


@pytest.mark.parametrize(("answer", "expected"), [
    (b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", (503, "7")),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", (200, None)),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", (204, None)),
    (b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n", (302, None)),
])
def test_an_answer_is_its_status_and_retry_after_whatever_its_framing(answer, expected):
    async def test() -> None:
        server, port = await serve(Script([answer], close_after=True))
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 5, 1000)
        assert await client.post(b"x", []) == expected
        await client.close()
        server.close()
    run(test)


def test_a_body_past_max_body_bytes_is_not_read_and_its_connection_is_dropped():
    async def test() -> None:
        big = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000
        script = Script([big])
        server, port = await serve(script)
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 5, 1000)
        assert await client.post(b"x", []) == (200, None)
        assert client._idle == []  # not kept: the rest of the body was never read
        assert (await client.post(b"y", []))[0] == 200 and script.connections == 2
        await client.close()
        server.close()
    run(test)


def test_no_answer_in_time_and_a_refused_connection_are_failures():
    async def test() -> None:
        server, port = await serve(Script([None]))
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 0.2, 1000)
        with pytest.raises(PostFailed) as failed:
            await client.post(b"x", [])
        assert failed.value.reason == "timeout"
        server.close()
        await server.wait_closed()
        refused = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 2, 1000)
        with pytest.raises(PostFailed) as failed:
            await refused.post(b"x", [])
        assert failed.value.reason == "connect"
    run(test)


def test_push_allow_is_checked_on_the_address_connected_to():
    async def test() -> None:
        script = Script([])
        server, port = await serve(script)
        for url, allow, allowed in [
                (f"http://127.0.0.1:{port}/", ["10.0.0.0/8"], False),  # an address not listed
                (f"http://localhost:{port}/", ["10.0.0.0/8"], False),  # a name resolving to one not listed
                (f"http://localhost:{port}/", ["127.0.0.0/8"], True),  # ... to listed ones
                (f"http://localhost:{port}/", ["localhost"], True)]:  # a listed name
            client = PushClient(url, PushAllow.parse(allow), 2, 1000)
            if allowed:
                assert (await client.post(b"x", []))[0] == 200
            else:
                with pytest.raises(PostFailed) as failed:
                    await client.post(b"x", [])
                assert failed.value.reason == "not allowed"
            await client.close()
        assert script.connections == 2  # the refused ones never connected
        server.close()
    run(test)


def test_a_certificate_the_system_does_not_trust_is_a_tls_failure(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    async def test() -> None:
        server, port = await serve(Script([]), tls)
        client = PushClient(f"https://localhost:{port}/", PushAllow.parse(["localhost"]), 2, 1000)
        with pytest.raises(PostFailed) as failed:
            await client.post(b"x", [])
        assert failed.value.reason == "tls"
        server.close()
    run(test)


def test_a_header_value_cannot_end_the_head():
    assert header_value("plain-id_1") == b"plain-id_1"
    assert header_value("a\r\nX-Evil: 1") == b"a%0D%0AX-Evil: 1"
    assert header_value("caf\u00e9\x00") == "caf\u00e9".encode() + b"%00"

    async def test() -> None:
        script = Script([])
        server, port = await serve(script)
        client = PushClient(f"http://127.0.0.1:{port}/", LOCAL, 2, 1000)
        await client.post(b"x", [("Hourglass-Msg-Id", "a\r\nX-Evil: 1")])
        assert b"\r\nX-Evil" not in script.requests[0] and b"Hourglass-Msg-Id: a%0D%0AX-Evil: 1\r\n" in script.requests[0]
        await client.close()
        server.close()
    run(test)
