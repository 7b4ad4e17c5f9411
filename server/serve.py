"""Run ``pbkv serve``: hypercorn's trio worker serving the app inside pbkv's nursery.

:func:`run_server` serves an already open live runtime and reports readiness through
``task_status`` with the bound address, so ``await nursery.start(run_server, ...)`` returns
once the socket listens (port 0 → the port the OS picked). :func:`serve` opens the runtime
first; :func:`open_server` is the context-manager form that tests and benchmarks use.
Uses ``hypercorn.trio.serve(app, config, shutdown_trigger=..., task_status=...)``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import trio

from pbkv.server.app import OpenAIApp, ServerConfig
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
    import hypercorn.trio

    sessions = SessionRegistry(
        runtime, idle_timeout_s=config.idle_timeout_s, max_sessions=config.max_sessions
    )
    app = OpenAIApp(runtime, sessions, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(sessions.run)
        serve = functools.partial(hypercorn.trio.serve, app, _hypercorn_config(config), mode="asgi")
        try:
            binds = await nursery.start(serve)
            parts = urlsplit(binds[0])
            address = ServerAddress(binds[0], parts.hostname or config.host, parts.port or 0)
            log.info("serving %s on %s", app.model, address.url)
            task_status.started(Server(address, app, sessions))
            await trio.sleep_forever()
        finally:
            app.draining = True


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
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_server, runtime, config)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
