"""The ASGI side of one ``pbkv serve`` request: what it declares, its body, its response.

Raw ASGI 3 (no framework). A request's headers and path are read from its ``scope``
(:func:`request_headers`, :func:`routed_path`); its body is read whole within the limits
of a :class:`BodyReader`; its response is written by a :class:`Responder`, whole or as
server-sent events written by hand (``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``), as
openai-python reads them; :func:`watch_disconnect` cancels the request when the client
goes away first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from pbkv.server.errors import APIError
from pbkv.server.schemas import encode

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_CONTENT_TYPE = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def content_length(scope: Scope) -> int:
    """Return the body length the request declares (0 when it declares none)."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return 0


def request_headers(scope: Scope) -> dict[str, str]:
    """Return the request headers, names lower-case, values decoded as UTF-8.

    Raises:
        APIError: 400 naming the header whose value is not valid UTF-8.
    """
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()  # header names are ASCII tokens
        try:
            headers[name] = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            raise APIError(
                400, f"header {name}: the value is not valid UTF-8", param=name
            ) from None
    return headers


def routed_path(path: str) -> str:
    """Return the path a request is routed by: ``path`` (percent-decoded, as ASGI's
    ``scope["path"]`` is) without trailing slashes, so ``/stats/`` and ``/stats//`` are
    ``/stats``. Authentication decides on this path too (one decision, no bypass)."""
    return path.rstrip("/") or "/"


class Disconnected(Exception):
    """The client went away before its request was read."""


@dataclass(frozen=True, slots=True)
class BodyReader:
    """Reads a request body within its limits.

    Args:
        max_body_bytes: larger bodies are refused (413).
        body_timeout_s: a body of which no part arrives for this long is refused (408).
    """

    max_body_bytes: int
    body_timeout_s: float

    @property
    def drained_bytes(self) -> int:
        """How much of a refused request's body is read and dropped before the refusal:
        twice ``max_body_bytes``, at least 16 MiB (a larger body's refusal is sent as it
        arrives; over HTTP/2 its connection is then closed)."""
        return max(2 * self.max_body_bytes, 16 * 2**20)

    def too_large(self) -> APIError:
        """Return the 413 of a body over ``max_body_bytes``."""
        return APIError(413, f"the body exceeds {self.max_body_bytes} bytes", code="body_too_large")

    async def read(self, receive: Receive, *, keep: bool = True) -> bytes:
        """Read the request body (``keep=False``: read and drop it; return ``b""``).

        Raises:
            APIError: 413 once it passes ``max_body_bytes`` (read on, and dropped, up to
                :attr:`drained_bytes`); 408 when no part of it arrives for
                ``body_timeout_s``.
            Disconnected: the client went away.
        """
        chunks: list[bytes] = []
        size = 0
        limit = self.max_body_bytes
        while True:
            message = await self._receive(receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.drained_bytes:
                raise self.too_large()
            if keep and size <= limit:
                chunks.append(chunk)
            if not message.get("more_body", False):
                if size > limit:
                    raise self.too_large()
                return b"".join(chunks)

    async def _receive(self, receive: Receive) -> dict[str, Any]:
        """Return the next piece of the request body.

        Raises:
            APIError: 408 when none arrives within ``body_timeout_s``.
            Disconnected: the client went away.
        """
        with trio.move_on_after(self.body_timeout_s):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            return message
        raise APIError(
            408,
            f"no part of the request body arrived for {self.body_timeout_s} s",
            code="body_timeout",
        )


class Responder:
    """Writes one HTTP response: a whole body, or server-sent events."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None
        self.events = False  # the response is a stream of server-sent events
        self.done = False  # the last body message is sent

    @property
    def started(self) -> bool:
        return self.status is not None

    async def whole(
        self,
        status: int,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]] = (),
        content_type: tuple[bytes, bytes] = JSON_CONTENT_TYPE,
    ) -> None:
        self.status = status
        await self._send(
            {"type": "http.response.start", "status": status, "headers": [content_type, *headers]}
        )
        self.done = True  # set before the last send: see watch_disconnect
        await self._send({"type": "http.response.body", "body": body})

    async def start_events(self, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.status = 200
        self.events = True
        await self._send(
            {"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *headers]}
        )

    async def event(self, record: Any, name: str | None = None) -> None:
        data = record if isinstance(record, bytes) else encode(record)
        head = b"event: " + name.encode() + b"\n" if name else b""
        await self._send(
            {
                "type": "http.response.body",
                "body": head + b"data: " + data + b"\n\n",
                "more_body": True,
            }
        )

    async def end_events(self) -> None:
        self.done = True  # set before the last send: see watch_disconnect
        await self._send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def watch_disconnect(
    receive: Receive, request_scope: trio.CancelScope, responder: Responder
) -> None:
    """Cancel the request when the client goes away before its response is complete.

    The server also reports ``http.disconnect`` once the last body message is sent
    (ASGI), which may reach this task while that send is still in progress: then
    nothing is cancelled (the response is complete), and no disconnect is counted.
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not responder.done:
                request_scope.cancel()
            return
