"""The server's connections: HTTP/2 (cleartext, prior knowledge) refusals of large bodies,
and a connection whose protocol fails is closed alone while the server goes on."""

from __future__ import annotations

import logging
import socket

import h2.config
import h2.connection
import h2.events
import httpx
import trio

from pbkv.server import ServerConfig
from pbkv.server.serve import _contained
from tests.server.conftest import serving

MODEL = "sim/qwen3-32b"
ONE_MB = b"a" * 1_000_000


def _h2_client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, http1=False, http2=True, timeout=30)


async def test_h2c_refusals_of_large_bodies_are_answered_and_the_server_survives():
    config = ServerConfig(port=0, api_keys={"key-a": "acme"}, max_body_bytes=64 * 1024)
    async with serving(config, engine="sim") as served:

        def refusals() -> list[tuple[str, int]]:
            with _h2_client(served.url) as client:
                asked = [
                    client.post("/health", content=ONE_MB),
                    client.post("/health", content=ONE_MB),  # the same connection, again
                    client.post("/v1/chat/completions", content=ONE_MB),
                    client.post(
                        "/v1/chat/completions",
                        content=ONE_MB,
                        headers={"Authorization": "Bearer key-a"},
                    ),
                    client.get("/health"),
                ]
            return [(r.http_version, r.status_code) for r in asked]

        answered = await served.run(refusals)
        health = await served.http("GET", "/health")
    assert answered == [("HTTP/2", s) for s in (405, 405, 401, 413, 200)]
    assert health.status_code == 200


def _h2_post_then_keep_sending(port: int, declared_bytes: int) -> tuple[int, bool]:
    """POST /v1/completions declaring ``declared_bytes``; once answered, send more DATA on the
    answered stream (what hypercorn's h2 handler fails on). Return the status read and
    whether the server closed the connection."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(conn.data_to_send())
        headers = [
            (":method", "POST"),
            (":path", "/v1/completions"),
            (":scheme", "http"),
            (":authority", f"127.0.0.1:{port}"),
            ("content-length", str(declared_bytes)),
        ]
        conn.send_headers(1, headers)
        conn.send_data(1, b"a" * 1000)
        sock.sendall(conn.data_to_send())
        status = 0
        while not status:
            for event in conn.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
        sock.sendall(conn.data_to_send())
        try:
            for _ in range(50):  # DATA on the stream the server answered and closed
                sock.sendall(b"\x00\x03\xe8\x00\x00\x00\x00\x00\x01" + b"a" * 1000)
            while sock.recv(65536):  # until the server closes the connection
                pass
            closed = True
        except TimeoutError:
            closed = False
        except OSError:  # reset: closed too
            closed = True
    return status, closed


async def test_a_connection_whose_protocol_fails_is_closed_alone(caplog):
    caplog.set_level(logging.ERROR, logger="pbkv.server.serve")
    async with serving(ServerConfig(port=0, max_body_bytes=1024), engine="sim") as served:
        stream_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        stream_body |= {"max_tokens": 40, "stream": True}  # about 2 s of modelled decode

        def stream() -> list[str]:
            with (
                httpx.Client(base_url=served.url, timeout=30) as client,
                client.stream("POST", "/v1/chat/completions", json=stream_body) as r,
            ):
                return [line for line in r.iter_lines() if line]

        async with trio.open_nursery() as nursery:
            streamed: list[list[str]] = []

            async def keep_streaming() -> None:
                streamed.append(await served.run(stream))

            nursery.start_soon(keep_streaming)
            await trio.sleep(0.5)
            port = served.server.address.port
            status, closed = await served.run(_h2_post_then_keep_sending, port, 64 * 2**20)
        health = await served.http("GET", "/health")
    assert (status, closed) == (413, True)
    assert streamed[0][-1] == "data: [DONE]"  # the other connection's stream finished
    assert health.status_code == 200
    assert any("connection from" in r.getMessage() for r in caplog.records)


async def test_contained_logs_a_connection_error_and_closes_that_stream(caplog):
    closed: list[bool] = []

    class Stream:
        socket = None

        async def aclose(self) -> None:
            closed.append(True)

    async def fails(stream: Stream) -> None:
        raise KeyError(1)

    with caplog.at_level(logging.ERROR, logger="pbkv.server.serve"):
        await _contained(fails, Stream())
    assert closed == [True]
    assert "KeyError" in caplog.text


async def test_shut_down_ends_every_open_workflow_while_the_runtime_runs():
    from pbkv.server.serve import shut_down

    async with serving(ServerConfig(port=0), engine="sim") as served:
        for i in range(40):
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            body |= {"max_tokens": 1, "pbkv": {"workflow_id": f"w{i}"}, "cache_salt": f"t{i % 4}"}
            assert (await served.http("POST", "/v1/chat/completions", json=body)).is_success
        assert len(served.runtime.active_workflows()) == 40
        with trio.fail_after(5):
            await shut_down(served.server, 5.0, trio.Event())
        active = served.runtime.active_workflows()
        refused = await served.http("GET", "/health")
    assert active == ()
    assert refused.status_code == 503
    assert {r.state for r in served.server.sessions.records()} == {"closed"}
