"""HTTP errors of ``pbkv serve`` as OpenAI-style error bodies.

Mirrors the OpenAI error envelope ``{"error": {"message", "type", "param", "code"}}`` and
its status conventions: 400 ``invalid_request_error`` for bad input, 401 for an unknown
API key, 404 ``model_not_found``, 413 for an oversized body, 429/503 with ``Retry-After``
when the runtime's admission queue is full or the server is shutting down.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from pbkv.server.schemas import ErrorBody, ErrorDetail, encode


class APIError(Exception):
    """An error answered as an HTTP status with an OpenAI-style body.

    Args:
        status: the HTTP status code.
        message: what was wrong, naming the field or value.
        type: OpenAI's error type (``invalid_request_error``, ``rate_limit_error``...).
        param: the request field at fault (a JSON path without ``$.``), if any.
        code: a machine-readable code (``model_not_found``, ``context_length_exceeded``).
        retry_after_s: sent as ``Retry-After`` (whole seconds) when set.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> bytes:
        """Return the JSON error body."""
        detail = ErrorDetail(self.message, self.type, self.param, self.code)
        return encode(ErrorBody(detail))

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Return the extra response headers (``Retry-After`` when set)."""
        if self.retry_after_s is None:
            return []
        return [(b"retry-after", str(self.retry_after_s).encode())]


T = TypeVar("T")

_PATH = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def _param(message: str) -> str | None:
    """Return the JSON path (without ``$.``) a msgspec validation ``message`` names: the
    field's own path for a missing required field (``messages[0].role``), else the path
    of the bad value; ``None`` when it names none."""
    match = _PATH.search(message)
    path = match.group("path") if match else ""
    missing = _MISSING.match(message)
    if missing:
        return f"{path}.{missing.group('field')}" if path else missing.group("field")
    return path or None


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """Decode a request ``body`` with ``decoder``.

    Raises:
        APIError: 400 naming the JSON path of the bad or missing field (``param``),
            saying the body is not JSON, or that it nests arrays and objects deeper than
            the decoder follows (msgspec stops at Python's recursion limit).
    """
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise APIError(400, f"invalid request: {text}", param=_param(text)) from None
    except msgspec.DecodeError as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise APIError(
            400,
            "the body nests JSON arrays and objects too deeply to decode",
            code="json_too_deep",
        ) from None
