"""A real ``pbkv serve`` on 127.0.0.1 (a free port): in this process over the tiny torch
model (:func:`serving`), or as the command in a subprocess on the sim engine
(:func:`serve_process`).

The openai client is the real, synchronous one, run in a worker thread so the server's
trio loop keeps serving; every client has a timeout and no retries, so a failure is
bounded in time and request count.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import trio

import pbkv
from pbkv.server import Server, ServerConfig, open_server

TIMEOUT_S = 60.0


@dataclass
class Served:
    """A running server, its runtime, and ways to reach it from a worker thread."""

    runtime: pbkv.Runtime
    server: Server

    @property
    def url(self) -> str:
        return self.server.address.url

    def client(self, api_key: str = "test", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.server.address.base_url,
            api_key=api_key,
            max_retries=0,
            timeout=TIMEOUT_S,
            **kwargs,
        )

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking client code in a thread (the server stays on this trio loop)."""
        return await trio.to_thread.run_sync(fn, *args)

    async def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        def send() -> httpx.Response:
            return httpx.request(method, self.url + path, timeout=TIMEOUT_S, **kwargs)

        return await self.run(send)

    def stats(self) -> dict[str, Any]:
        return self.server.app.statistics()


@asynccontextmanager
async def serving(config: ServerConfig | None = None, **runtime: Any) -> AsyncIterator[Served]:
    """Open a tiny-model runtime (fresh cache) and serve it on 127.0.0.1."""
    runtime.setdefault("engine", "torch")
    runtime.setdefault("check_integrity", True)
    async with (
        pbkv.open_runtime(**runtime) as rt,
        open_server(rt, config or ServerConfig(port=0)) as server,
    ):
        yield Served(rt, server)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving() as s:
        yield s


def chat(*turns: str, system: str = "You are a careful planner.") -> list[dict[str, str]]:
    """Return chat messages: a system message, then user/assistant turns alternating."""
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


@dataclass
class ServeProcess:
    """A ``pbkv serve`` subprocess that has printed where it listens.

    Attributes:
        proc: the process (stdout and stderr are pipes, text).
        url: ``http://127.0.0.1:PORT``, from its first line.
        banner: that first line.
    """

    proc: subprocess.Popen[str]
    url: str
    banner: str

    def stopped(self, timeout_s: float = 30.0) -> str:
        """Wait for the process to exit; return the rest of its stdout."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        return out


@contextmanager
def serve_process(*flags: str) -> Iterator[ServeProcess]:
    """Run ``pbkv serve --engine sim --port 0 *flags`` in a subprocess; yield it once it
    has printed its URL, and kill it on the way out if it still runs.

    Raises:
        AssertionError: its first line names no URL (the line is the message).
    """
    command = [sys.executable, "-m", "pbkv.cli", "serve", "--engine", "sim", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*command, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        yield ServeProcess(proc, f"http://127.0.0.1:{found.group(1)}", line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
