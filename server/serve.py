"""Run ``pbkv serve``: hypercorn's trio worker serving the app inside pbkv's nursery.

:func:`run_server` serves an already open live runtime and reports readiness through
``task_status`` with the bound address, so ``await nursery.start(run_server, ...)`` returns
once the socket listens (port 0 → the port the OS picked). :func:`serve` opens the runtime
first; :func:`open_server` is the context-manager form that tests and benchmarks use.

Connections are hypercorn's (``hypercorn.trio.tcp_server.TCPServer``, HTTP/1.1 and
HTTP/2), accepted here rather than by ``hypercorn.trio.serve`` so that each runs
contained: ``hypercorn.trio.run.worker_serve`` runs every connection in one nursery, where
one connection's protocol error ends the server (hypercorn's h2 handler raises
``KeyError`` on DATA for a stream it has already answered, and so ends every request in
flight). Here such an error is logged and closes that connection alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import trio

from pbkv.runtime.errors import ungrouped
from pbkv.server.app import OpenAIApp
from pbkv.server.config import ServerConfig
from pbkv.server.sessions import SessionRegistry

log = logging.getLogger(__name__)


class ServerAddress(NamedTuple):
    """Where a started server listens: ``url`` (``http://127.0.0.1:PORT``) and its parts."""

    url: str
    host: str
    port: int

    @property
    def base_url(self) -> str:
        """Return the OpenAI clients' ``base_url`` (``{url}/v1``)."""
        return f"{self.url}/v1"


class Server(NamedTuple):
    """A running server: its address, app (statistics) and session registry."""

    address: ServerAddress
    app: OpenAIApp
    sessions: SessionRegistry


def _hypercorn_config(config: ServerConfig) -> Any:
    from hypercorn.config import Config

    hc = Config()
    hc.bind = [f"{config.host}:{config.port}"]
    hc.graceful_timeout = config.graceful_timeout_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = 30.0
    return hc


async def _contained(serve_one: Callable[[Any], Awaitable[None]], stream: Any) -> None:
    """Serve one connection; an error of its own closes it and goes no further.

    Logged with the peer's address. Cancellation (shutdown) passes through.
    """
    try:
        peer = stream.socket.getpeername()
    except (AttributeError, OSError):
        peer = "?"
    try:
        await serve_one(stream)
    except Exception:
        log.exception("connection from %s failed; it is closed, the server goes on", peer)
        await trio.aclose_forcefully(stream)


async def _serve_http(
    app: OpenAIApp, hc: Any, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    """Accept connections on ``hc.bind`` and serve ``app`` over each, contained.

    What ``hypercorn.trio.serve`` does for plain-HTTP binds (hypercorn/trio/run.py:
    ``worker_serve``), less TLS, QUIC and the lifespan protocol (the app keeps no
    lifespan state), with each connection run by :func:`_contained`.

    Args:
        app: the ASGI app.
        hc: a ``hypercorn.config.Config`` (:func:`_hypercorn_config`).
        task_status: receives the bound URLs (``http://HOST:PORT``) once they listen.

    Raises:
        OSError: an address cannot be bound.
    """
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import repr_socket_addr, wrap_app

    wrapped = wrap_app(app, hc.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    listeners, binds = [], []
    for sock in hc.create_sockets().insecure_sockets:
        sock.listen(hc.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")

    async def serve_one(stream: Any) -> None:
        await TCPServer(wrapped, hc, context, ConnectionState({}), stream)

    try:
        async with trio.open_nursery() as nursery:
            task_status.started(binds)
            await trio.serve_listeners(
                functools.partial(_contained, serve_one), listeners, handler_nursery=nursery
            )
    finally:
        await context.terminated.set()


async def run_server(
    runtime: Any,
    config: ServerConfig,
    *,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``runtime`` over HTTP until cancelled.

    Args:
        runtime: an open live runtime (``pbkv.open_runtime``).
        config: where to listen and how to serve.
        task_status: receives the :class:`Server` once the socket listens.

    Raises:
        OSError: the address cannot be bound.
    """
    sessions = SessionRegistry(
        runtime,
        idle_timeout_s=config.idle_timeout_s,
        max_sessions=config.max_sessions,
        max_sessions_per_tenant=config.max_sessions_per_tenant,
    )
    app = OpenAIApp(runtime, sessions, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(sessions.run)
        try:
            binds = await nursery.start(_serve_http, app, _hypercorn_config(config))
            parts = urlsplit(binds[0])
            address = ServerAddress(binds[0], parts.hostname or config.host, parts.port or 0)
            log.info("serving %s on %s", app.model, address.url)
            task_status.started(Server(address, app, sessions))
            await trio.sleep_forever()
        finally:
            app.draining = True


async def shut_down(server: Server, graceful_timeout_s: float, hurry: trio.Event) -> None:
    """Drain ``server`` and end its open workflows, while its runtime still runs.

    The requests in flight get ``graceful_timeout_s`` to finish (less once ``hurry`` is
    set); then those left are answered 503 (a stream: an error event and ``[DONE]``).
    The open workflows are then ended, within what is left of ``graceful_timeout_s``
    (at least a second), before the caller cancels the server and closes its runtime.
    """
    deadline_s = trio.current_time() + graceful_timeout_s
    await server.app.drain(graceful_timeout_s, hurry)
    await server.sessions.close(max(deadline_s - trio.current_time(), 1.0))


async def serve(
    runtime_config: Any,
    config: ServerConfig,
    *,
    forecasters: Sequence[Any] = (),
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open a live runtime from ``runtime_config`` and serve it until cancelled.

    Args:
        runtime_config: a :class:`pbkv.RuntimeConfig`.
        config: where to listen and how to serve.
        forecasters: the predictor's fallback chain (empty: no forecasts).
        task_status: receives the :class:`Server` once the socket listens.
    """
    from pbkv.live import open_runtime

    async with open_runtime(runtime_config, forecasters=forecasters) as runtime:
        await run_server(runtime, config, task_status=task_status)


@asynccontextmanager
async def open_server(runtime: Any, config: ServerConfig | None = None) -> AsyncIterator[Server]:
    """Serve ``runtime`` for the duration of the block (default: 127.0.0.1, a free port)."""
    config = config or ServerConfig(port=0)
    with ungrouped():  # the block's own error reaches the caller as itself (trio >= 0.25)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(run_server, runtime, config)
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
