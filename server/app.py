"""The ASGI application of ``pbkv serve``: OpenAI-compatible routes over a live runtime.

Raw ASGI 3 (no framework), run by hypercorn's trio worker in pbkv's own nursery. Each
request is read whole (bounded by ``max_body_bytes``), decoded once into a typed record
(:mod:`pbkv.server.schemas`), resolved to a workflow and agent (:mod:`pbkv.server.hints`)
and served as one call of that live workflow. While it runs, a watcher reads the ASGI
channel: a client that disconnects cancels the request, which cancels the engine request
and releases its cache leases. Streams are written as server-sent events by hand
(``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``), as openai-python reads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
import trio

from pbkv.server.errors import APIError, decode_body
from pbkv.server.hints import Hints, bearer_key, key_tenant, resolve_hints
from pbkv.server.prompts import check_size, tokenize
from pbkv.server.responses import (
    RESPONSES_DECODER,
    ResponseBuilder,
    ResponsesRequest,
    chat_view,
    response_usage,
)
from pbkv.server.sampling import request_sampling
from pbkv.server.schemas import (
    CHAT_DECODER,
    COMPLETION_DECODER,
    WORKFLOW_END_DECODER,
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionRequest,
    FunctionCall,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TextChoice,
    ToolCall,
    ToolCallDelta,
    Usage,
    WorkflowHints,
    encode,
)
from pbkv.server.sessions import Lease, SessionRegistry
from pbkv.server.stats import HTTPCounters, prometheus_text, serving, snapshot
from pbkv.server.stop import StopCutter, StopWatch, streamed_text
from pbkv.server.toolcalls import (
    ReplyContext,
    ReplyPlan,
    ReplySource,
    reply_plan,
    simulated_text,
)
from pbkv.server.toolparsers import ParsedCall, make_tool_parser, parse_reply

log = logging.getLogger(__name__)
_TEXT = ReplyPlan()  # a text reply: no tools, no format

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_ROLES = {"developer": "system"}  # OpenAI's newer name for system messages
_OPEN_PATHS = frozenset({"/health", "/metrics"})  # answered without an API key


def _content_length(scope: Scope) -> int:
    """Return the body length the request declares (0 when it declares none)."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return 0


class InjectedFault(RuntimeError):
    """Raised by the stop callback of a request with ``X-PBKV-Inject-Fault: until`` on a
    server with ``fault_injection`` (fault tests: one call's own failure)."""


def _failing_until(token: int) -> bool:
    raise InjectedFault("a fault injected into this request's stop callback")


FAULT_HEADER = "x-pbkv-inject-fault"


def _fault_header(scope: Scope) -> str | None:
    """Return the fault a request asks to have injected (``until``), if any.

    Raises:
        APIError: 400 naming the header for a fault other than ``until``.
    """
    value = _headers(scope).get(FAULT_HEADER)
    if value is None:
        return None
    if value.strip().lower() != "until":
        raise APIError(
            400,
            f"header {FAULT_HEADER}: the fault 'until' is known, got {value!r}",
            param=FAULT_HEADER,
        )
    return "until"


def _owns(tenant: str, namespace: str) -> bool:
    """Whether ``namespace`` (a workflow's tenant) is ``tenant`` or one of its salted
    namespaces (``tenant/salt``); the default tenant ``""`` owns only ``""``."""
    return namespace == tenant or (bool(tenant) and namespace.startswith(tenant + "/"))


def _only_workflows(runtime_stats: Any, live_ids: set[str]) -> Any:
    """Return ``runtime_stats`` with ``agents_by_workflow`` cut to ``live_ids`` (the other
    counters are totals: they name no workflow)."""
    agents = getattr(runtime_stats, "agents_by_workflow", None)
    if agents is None:
        return runtime_stats
    mine = {wf: names for wf, names in agents.items() if wf in live_ids}
    return dataclasses.replace(runtime_stats, agents_by_workflow=mine)


def routed_path(path: str) -> str:
    """Return the path a request is routed by: ``path`` (percent-decoded, as ASGI's
    ``scope["path"]`` is) without trailing slashes, so ``/stats/`` and ``/stats//`` are
    ``/stats``. Authentication decides on this path too (one decision, no bypass)."""
    return path.rstrip("/") or "/"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How ``pbkv serve`` listens and serves.

    Args:
        host: address to bind (``127.0.0.1``: this machine only).
        port: TCP port; 0 picks a free one (the bound URL is reported at start).
        idle_timeout_s: a workflow never marked final ends after this long idle.
        max_sessions: open hinted workflows at most (see :class:`SessionRegistry`).
        api_keys: API key → tenant; ``None`` accepts any key (tenants from ``cache_salt``).
        default_max_tokens: the decode budget of a request that sets none (less when the
            context length leaves less room).
        max_body_bytes: larger request bodies are refused (413).
        retry_after_s: the ``Retry-After`` of a 429/503 answer.
        served_model_name: the model name clients send (default: the runtime's); it is
            the name replies and ``/v1/models`` report first.
        model_aliases: more names clients may send for the same model (vLLM's
            ``--served-model-name`` with several names).
        tool_call_parser: the parser that reads tool calls out of replies
            (:data:`pbkv.server.toolparsers.TOOL_CALL_PARSERS`; ``hermes``).
        reply_source: on an engine that samples no text (sim), what replies say: called
            with each chat request's :class:`~pbkv.server.toolcalls.ReplyContext`, its
            text is the reply (``None``: a schema-valid tool call or JSON where the
            request asks for one, else filler). Drives framework loops
            deterministically in tests.
        graceful_timeout_s: how long requests in flight may finish at shutdown.
        admin_key: the API key whose ``GET /stats`` lists every tenant's workflows (any
            other key's lists its own tenant's; without keys, the default tenant's).
        body_timeout_s: a request body of which no part arrives for this long is refused
            (408), so a client stalled mid-body does not keep its request for ever (as
            nginx's ``client_body_timeout``: the wait between two reads, not the whole).
        max_sessions_per_tenant: open hinted workflows of one tenant at most (see
            :class:`SessionRegistry`).
        fault_injection: for fault tests only: a request with the header
            ``X-PBKV-Inject-Fault: until`` gets a stop callback that raises at its first
            token (the engine's handling of a failing callback is what is tested).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    idle_timeout_s: float = 300.0
    max_sessions: int = 4096
    api_keys: Mapping[str, str] | None = None
    default_max_tokens: int = 256
    max_body_bytes: int = 4 * 2**20
    retry_after_s: int = 1
    served_model_name: str | None = None
    graceful_timeout_s: float = 5.0
    admin_key: str | None = None
    body_timeout_s: float = 30.0
    max_sessions_per_tenant: int = 1024
    fault_injection: bool = False
    model_aliases: tuple[str, ...] = ()
    tool_call_parser: str = "hermes"
    reply_source: ReplySource | None = None

    def __post_init__(self) -> None:
        make_tool_parser(self.tool_call_parser)  # an unknown name: ValueError listing them
        for alias in self.model_aliases:
            if not alias or not isinstance(alias, str):
                raise ValueError(f"model_aliases must be non-empty names, got {alias!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "idle_timeout_s",
            "default_max_tokens",
            "max_body_bytes",
            "max_sessions",
            "max_sessions_per_tenant",
            "body_timeout_s",
        ):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # NaN fails both
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not (self.graceful_timeout_s >= 0 and math.isfinite(self.graceful_timeout_s)):
            raise ValueError(f"graceful_timeout_s must be >= 0, got {self.graceful_timeout_s}")
        if self.admin_key is not None and not self.admin_key:
            raise ValueError("admin_key must not be empty")
        for key, tenant in (self.api_keys or {}).items():
            if not key or not tenant or "/" in tenant:
                raise ValueError(
                    f"api_keys: key {key!r} → tenant {tenant!r}: both must be non-empty and "
                    "the tenant must not contain '/'"
                )


class _Accepted(NamedTuple):
    """A request let in: its route template, handler and body."""

    route: str
    handler: Callable[..., Awaitable[None]]
    body: bytes


class _Disconnected(Exception):
    """The client went away before its request was read."""


class _Responder:
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
        content_type: tuple[bytes, bytes] = _JSON,
    ) -> None:
        self.status = status
        await self._send(
            {"type": "http.response.start", "status": status, "headers": [content_type, *headers]}
        )
        self.done = True  # set before the last send: see _watch_disconnect
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
        self.done = True  # set before the last send: see _watch_disconnect
        await self._send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@dataclass(frozen=True, slots=True)
class _Generation:
    """One decoded request, ready to run: prompt, budget, sampling and stream options."""

    endpoint: str
    prompt: tuple[Any, ...]  # pbkv.Segment s, templated once here
    prompt_tokens: int
    max_new_tokens: int
    budget_param: str  # the request field the budget came from (max_tokens...)
    sampling: Any
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    inject_fault: bool = False  # ServerConfig.fault_injection: the stop callback raises
    plan: ReplyPlan = _TEXT  # tools, tool choice and output format (chat)
    simulated: Any = None  # pbkv.Simulated: the reply on an engine that samples no text
    constraint: Any = None  # pbkv.engines.constrained.TokenConstraint of the reply

    @property
    def prompt_param(self) -> str:
        """The request field that holds the prompt."""
        return _prompt_param(self.endpoint)


def _prompt_param(endpoint: str) -> str:
    """The request field that holds the prompt of ``endpoint`` (``chat``, ``text`` or
    ``responses``)."""
    return {"chat": "messages", "responses": "input"}.get(endpoint, "prompt")


def _in_chain(exc: BaseException, found: Callable[[BaseException], bool]) -> bool:
    """Whether ``exc`` or an error in its cause (or context) chain is ``found``."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if found(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _never_fits(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error in its cause chain) says the request can never fit
    the GPU KV tier: :class:`RequestTooLarge`, or the live runtime's :class:`CallFailed`
    that carries it as text (the only engine error that is not retryable)."""
    from pbkv.engines.base import RequestTooLarge
    from pbkv.live.session import CallFailed

    return _in_chain(
        exc,
        lambda e: isinstance(e, RequestTooLarge) or (isinstance(e, CallFailed) and not e.retryable),
    )


def _usage(reply: Any) -> Usage:
    completion = len(reply.token_ids)
    return Usage(
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=completion,
        total_tokens=reply.prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=reply.cached_tokens),
    )


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 4:
        raise APIError(400, f"stop: at most 4 sequences, got {len(stops)}", param="stop")
    return stops


def _headers(scope: Scope) -> dict[str, str]:
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


def _context_error(param: str, prompt_tokens: int, budget: int, context: int) -> APIError:
    """Return the 400 of a request past the context length, naming the field at fault."""
    return APIError(
        400,
        f"{param}: this model's context length is {context} tokens; the request needs "
        f"{prompt_tokens + budget} ({prompt_tokens} in the prompt, {budget} to generate)",
        param=param,
        code="context_length_exceeded",
    )


class OpenAIApp:
    """The ASGI app: routes, request decoding, workflow hints, errors and statistics.

    Args:
        runtime: an open live runtime (``pbkv.open_runtime``).
        sessions: the registry mapping workflow hints to live workflows.
        config: the server configuration.
    """

    def __init__(self, runtime: Any, sessions: SessionRegistry, config: ServerConfig) -> None:
        self._runtime = runtime
        self._sessions = sessions
        self._config = config
        self.model = config.served_model_name or runtime.model_name
        self.model_names = (self.model, *(a for a in config.model_aliases if a != self.model))
        self.http = HTTPCounters()
        self.draining = False
        self._generating = 0  # chat and text completions in flight
        self._requests: set[trio.CancelScope] = set()
        self._cut: set[trio.CancelScope] = set()  # cancelled by drain, not by the client
        self._created = int(time.time())  # OpenAI's "created" is Unix wall-clock seconds
        self._routes: dict[tuple[str, str], Callable[..., Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/responses"): self._responses,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("HEAD", "/health"): self._health_head,
            ("GET", "/stats"): self._stats,
            ("GET", "/metrics"): self._metrics,
        }
        self._prefix_routes: tuple[
            tuple[str, str, str, str, Callable[..., Awaitable[None]]], ...
        ] = (
            ("GET", "/v1/models/", "", "/v1/models/{model}", self._model),
            ("POST", "/v1/pbkv/workflows/", "/end", "/v1/pbkv/workflows/{id}/end", self._end),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def statistics(self, tenant: str | None = None) -> dict[str, Any]:
        """Return the statistics document of ``GET /stats``.

        Args:
            tenant: list only this tenant's workflows (its ``cache_salt`` namespaces
                included); ``None`` lists every tenant's.
        """
        workflows = self._sessions.records()
        runtime_stats = self._runtime.statistics()
        if tenant is not None:
            workflows = [w for w in workflows if _owns(tenant, w.tenant)]
            runtime_stats = _only_workflows(runtime_stats, {w.live_id for w in workflows})
        return snapshot(
            model=self.model,
            runtime_stats=runtime_stats,
            sessions=self._sessions.statistics(),
            workflows=workflows,
            http=self.http,
            served=serving(self._runtime),
        )

    async def drain(self, timeout_s: float, hurry: trio.Event | None = None) -> None:
        """Stop taking generation requests and let those in flight finish.

        From now on a new completion request (and ``/health``) gets 503 with
        ``Retry-After``; the requests in flight have ``timeout_s`` to finish, or until
        ``hurry`` is set (a second Ctrl-C). Those still running then are cancelled (their
        engine requests withdrawn) and answered 503 ``shutting_down``: a stream gets an
        error event and ``data: [DONE]``. Returns once no completion is in flight (or a
        second later, whatever a client does).

        Mutates: ``draining``.
        """
        self.draining = True
        with trio.move_on_after(timeout_s):
            while self._generating and not (hurry is not None and hurry.is_set()):
                await trio.sleep(0.05)
        if not self._generating:
            return
        log.warning("cutting %d requests still in flight at shutdown", self._generating)
        for scope in list(self._requests):
            self._cut.add(scope)
            scope.cancel()
        with trio.move_on_after(1.0):
            while self._requests & self._cut:
                await trio.sleep(0.01)

    def _route(self, method: str, path: str) -> tuple[str, Callable[..., Awaitable[None]]]:
        """Return the route template and handler of ``path`` (already :func:`routed_path`).

        Raises:
            APIError: 405 for a known path and another method; 404 for an unknown path.
        """
        handler = self._routes.get((method, path))
        if handler is not None:
            return path, handler
        for verb, head, tail, template, prefixed in self._prefix_routes:
            if path.startswith(head) and path.endswith(tail) and len(path) > len(head + tail):
                if method != verb:
                    raise APIError(
                        405, f"{method} is not allowed on {template}", code="method_not_allowed"
                    )
                return template, prefixed
        if any(p == path for _, p in self._routes):
            raise APIError(405, f"{method} is not allowed on {path}", code="method_not_allowed")
        raise APIError(404, f"no route {method} {path}", code="not_found")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        responder = _Responder(send)
        route = "unrouted"
        self.http.in_flight += 1
        request_scope = trio.CancelScope()
        self._requests.add(request_scope)
        try:
            with request_scope:
                async with trio.open_nursery() as nursery:
                    try:
                        route, handler, body = await self._accept(scope, receive)
                        nursery.start_soon(
                            self._watch_disconnect, receive, request_scope, responder
                        )
                        await handler(scope, body, responder)
                    except _Disconnected:
                        request_scope.cancel()
                    except Exception as exc:  # answered as an error body, never a crash
                        await self._answer_error(responder, exc)
                    nursery.cancel_scope.cancel()
            if request_scope in self._cut and not responder.done:
                await self._answer_error(responder, self._draining_error())
            elif request_scope.cancelled_caught and not responder.done:
                self.http.disconnects += 1
                log.info("client disconnected from %s; request cancelled", route)
        finally:
            self._requests.discard(request_scope)
            self._cut.discard(request_scope)
            self.http.in_flight -= 1
            self.http.count(route, responder.status or 499)

    async def _accept(self, scope: Scope, receive: Receive) -> _Accepted:
        """Authenticate and route a request, then read its body.

        A request refused before its body is read (401, 404, 405, or 413 by its
        ``content-length``) has the body read and dropped first, up to
        :attr:`_drained_bytes` and while it keeps arriving: a client still sending then
        reads the refusal, and over HTTP/2 its connection stays usable (an answer sent
        before the body ends leaves DATA frames for a closed stream).

        Returns:
            The route template, its handler and the body.

        Raises:
            APIError: the refusal; 413 for a body over ``max_body_bytes``; 408 for one
                of which nothing arrives for ``body_timeout_s``.
            _Disconnected: the client went away first.
        """
        refusal: APIError | None = None
        declared = _content_length(scope)
        try:
            path = routed_path(scope["path"])
            self._authenticate(scope, path)
            route, handler = self._route(scope["method"], path)
            if declared > self._config.max_body_bytes:
                raise self._too_large()
        except APIError as exc:
            refusal = exc
        if refusal is None:
            return _Accepted(route, handler, await self._read_body(receive))
        if declared <= self._drained_bytes:
            with contextlib.suppress(APIError):  # too long or too slow: refused as it is
                await self._read_body(receive, keep=False)
        raise refusal

    def _authenticate(self, scope: Scope, path: str) -> None:
        """Refuse a request without a known API key, when keys are configured, before
        anything else is looked at. One decision on the routed path ``path``
        (:func:`routed_path`): ``/health`` and ``/metrics`` stay open, as in vLLM, for
        probes and scrapers; every other path, unknown ones included, needs a key.
        ``/stats`` also takes the admin key. The tenant is read later, by :meth:`_hints`.

        Raises:
            APIError: 401 for a missing or unknown key; 400 for a header not in UTF-8.
        """
        if path in _OPEN_PATHS:
            return
        headers = _headers(scope)
        if path == "/stats" and self._is_admin(headers):
            return
        if self._config.api_keys is not None:
            key_tenant(headers, self._config.api_keys)

    def _is_admin(self, headers: Mapping[str, str]) -> bool:
        """Whether the request's key is the admin key."""
        admin, key = self._config.admin_key, bearer_key(headers)
        return admin is not None and key is not None and secrets.compare_digest(key, admin)

    @property
    def _drained_bytes(self) -> int:
        """How much of a refused request's body is read and dropped before the refusal:
        twice ``max_body_bytes``, at least 16 MiB (a larger body's refusal is sent as it
        arrives; over HTTP/2 its connection is then closed)."""
        return max(2 * self._config.max_body_bytes, 16 * 2**20)

    def _too_large(self) -> APIError:
        return APIError(
            413, f"the body exceeds {self._config.max_body_bytes} bytes", code="body_too_large"
        )

    async def _read_body(self, receive: Receive, *, keep: bool = True) -> bytes:
        """Read the request body (``keep=False``: read and drop it; return ``b""``).

        Raises:
            APIError: 413 once it passes ``max_body_bytes`` (read on, and dropped, up to
                :attr:`_drained_bytes`); 408 when no part of it arrives for
                ``body_timeout_s``.
            _Disconnected: the client went away.
        """
        chunks: list[bytes] = []
        size = 0
        limit = self._config.max_body_bytes
        while True:
            message = await self._receive_body(receive)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._drained_bytes:
                raise self._too_large()
            if keep and size <= limit:
                chunks.append(chunk)
            if not message.get("more_body", False):
                if size > limit:
                    raise self._too_large()
                return b"".join(chunks)

    async def _receive_body(self, receive: Receive) -> dict[str, Any]:
        """Return the next piece of the request body.

        Raises:
            APIError: 408 when none arrives within ``body_timeout_s``.
            _Disconnected: the client went away.
        """
        with trio.move_on_after(self._config.body_timeout_s):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            return message
        raise APIError(
            408,
            f"no part of the request body arrived for {self._config.body_timeout_s} s",
            code="body_timeout",
        )

    @staticmethod
    async def _watch_disconnect(
        receive: Receive, request_scope: trio.CancelScope, responder: _Responder
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

    async def _answer_error(self, responder: _Responder, exc: Exception) -> None:
        error = self._as_api_error(exc)
        if responder.events:  # headers are sent: the error travels as an event
            await responder.event(error.body())
            await responder.end_events()
        elif not responder.started:
            await responder.whole(error.status, error.body(), error.headers())

    def _as_api_error(self, exc: Exception) -> APIError:
        from pbkv.engines.base import EngineError
        from pbkv.live import Overloaded, PromptTooLong, WorkflowEnded

        retry = self._config.retry_after_s
        match exc:
            case APIError():
                return exc
            case _ if _in_chain(exc, lambda e: isinstance(e, InjectedFault)):
                return APIError(500, str(exc), type="server_error", code="injected_fault")
            case _ if _never_fits(exc):  # normally named by _serve; this is the fallback
                return APIError(400, str(exc), code="context_length_exceeded")
            case PromptTooLong():
                return APIError(400, str(exc), param="messages", code="context_length_exceeded")
            case Overloaded():
                retry = max(retry, math.ceil(exc.retry_after_s))
                return APIError(
                    429, str(exc), type="rate_limit_error", code="overloaded", retry_after_s=retry
                )
            case WorkflowEnded():
                return APIError(409, str(exc), code="workflow_ended")
            case ValueError() | TypeError():
                return APIError(400, str(exc))
            case EngineError():
                log.warning("engine failed a request: %s", exc)
                return APIError(500, f"the engine failed the request: {exc}", type="server_error")
            case _:
                log.exception("unexpected error serving a request", exc_info=exc)
                return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")

    # Routes

    async def _health(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        if self.draining:
            raise self._draining_error()
        await responder.whole(200, encode({"status": "ok", "model": self.model}))

    async def _health_head(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        if self.draining:
            raise self._draining_error()
        await responder.whole(200, b"")

    def _draining_error(self) -> APIError:
        return APIError(
            503,
            "the server is shutting down",
            type="server_error",
            code="shutting_down",
            retry_after_s=self._config.retry_after_s,
        )

    async def _models(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        cards = [ModelCard(name, self._created) for name in self.model_names]
        await responder.whole(200, encode(ModelList(cards)))

    async def _model(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        name = scope["path"].rstrip("/").removeprefix("/v1/models/")
        self._check_model(name)
        await responder.whole(200, encode(ModelCard(name, self._created)))

    async def _end(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        """End a workflow without generating (``POST /v1/pbkv/workflows/{id}/end``): the
        hook a framework calls when its run ends. The tenant is the API key's, and the
        body's ``cache_salt`` (optional) as a completion request's. A workflow with
        requests in flight ends once they finish.

        Raises:
            APIError: 404 ``workflow_not_found`` when no open workflow has this id.
        """
        request = decode_body(WORKFLOW_END_DECODER, body or b"{}")
        path = routed_path(scope["path"])
        workflow_id = path.removeprefix("/v1/pbkv/workflows/").removesuffix("/end")
        headers = _headers(scope)
        tenant = key_tenant(headers, self._config.api_keys)
        hints = resolve_hints(
            {}, WorkflowHints(workflow_id=workflow_id), cache_salt=request.cache_salt, tenant=tenant
        )
        record = await self._sessions.end_workflow(hints)
        if record is None:
            raise APIError(
                404,
                f"no open workflow {workflow_id!r} (never opened, or already ended)",
                param="workflow_id",
                code="workflow_not_found",
            )
        await responder.whole(200, msgspec.json.encode(record))

    async def _stats(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        """Answer the statistics with the workflows the caller may see: every tenant's
        for the admin key, the key's tenant's for another key, and without keys the
        default tenant's (a ``cache_salt`` is a secret; its workflows are not listed)."""
        headers = _headers(scope)
        admin = self._is_admin(headers)
        tenant = None if admin else key_tenant(headers, self._config.api_keys)
        await responder.whole(200, msgspec.json.encode(self.statistics(tenant)))

    async def _metrics(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        text = prometheus_text(
            runtime_stats=self._runtime.statistics(),
            sessions=self._sessions.statistics(),
            http=self.http,
            served=serving(self._runtime),
        ).encode()
        await responder.whole(
            200, text, content_type=(b"content-type", b"text/plain; version=0.0.4")
        )

    async def _chat(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        request = decode_body(CHAT_DECODER, body)
        plan = reply_plan(request.tools, request.tool_choice, request.response_format)
        messages = [_message_dict(m) for m in request.messages]
        await self._serve(scope, request, "chat", messages, responder, plan)

    async def _responses(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        request = decode_body(RESPONSES_DECODER, body)
        view = chat_view(request)
        plan = reply_plan(view.tools, view.tool_choice, view.response_format)
        await self._serve(scope, request, "responses", view.messages, responder, plan)

    async def _completions(self, scope: Scope, body: bytes, responder: _Responder) -> None:
        request = decode_body(COMPLETION_DECODER, body)
        prompt = request.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise APIError(
                    400,
                    f"prompt: one prompt per request is served, got {len(prompt)}",
                    param="prompt",
                )
            prompt = prompt[0]
        if not prompt:
            raise APIError(400, "prompt: must not be empty", param="prompt")
        await self._serve(scope, request, "text", prompt, responder)

    # Serving one generation

    def _check_model(self, name: str) -> None:
        if name not in self.model_names:
            served = ", ".join(f"`{n}`" for n in self.model_names)
            raise APIError(
                404,
                f"the model `{name}` does not exist; this server serves {served}",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def _hints(self, scope: Scope, request: Any) -> Hints:
        headers = _headers(scope)
        tenant = key_tenant(headers, self._config.api_keys)
        return resolve_hints(headers, request.pbkv, cache_salt=request.cache_salt, tenant=tenant)

    async def _generation(
        self,
        endpoint: str,
        request: ChatCompletionRequest | CompletionRequest | ResponsesRequest,
        prompt: str | list[dict[str, Any]],
        plan: ReplyPlan,
    ) -> _Generation:
        """Check ``request`` and tokenize its prompt (the size first, see
        :mod:`pbkv.server.prompts`); return what to run.

        Raises:
            APIError: 400 naming the field at fault.
        """
        if request.n != 1:
            raise APIError(400, f"n: only 1 choice is served, got {request.n}", param="n")
        if not isinstance(request, ResponsesRequest):  # chat_view refused what it does not serve
            _refuse_unserved(request)
        chat = self._runtime.chat
        check_size(prompt, _prompt_param(endpoint), chat.context_length_tokens, plan.tools)
        segments = await tokenize(chat, prompt, plan.tools)
        prompt_tokens = sum(len(s.token_ids) for s in segments)
        budget_param, budget = "max_tokens", request.max_tokens
        if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens:
            budget_param, budget = "max_completion_tokens", request.max_completion_tokens
        elif isinstance(request, ResponsesRequest):
            budget_param = "max_output_tokens"
        room = chat.context_length_tokens - prompt_tokens
        prompt_param = _prompt_param(endpoint)
        if room < 1:
            raise _context_error(prompt_param, prompt_tokens, 1, chat.context_length_tokens)
        if budget is None:  # as OpenAI: what the context leaves, up to the default
            budget = min(self._config.default_max_tokens, room)
            tier_room = self._gpu_tier_tokens() - prompt_tokens
            if tier_room >= 1:  # and what the GPU tier can hold beside the prompt
                budget = min(budget, tier_room)
        elif budget > room:
            raise _context_error(budget_param, prompt_tokens, budget, chat.context_length_tokens)
        sampling = request_sampling(request.temperature, request.top_p, request.seed)
        options = request.stream_options
        return _Generation(
            endpoint=endpoint,
            prompt=segments,
            prompt_tokens=prompt_tokens,
            max_new_tokens=budget,
            budget_param=budget_param,
            sampling=sampling,
            stops=_stops(request.stop),
            stream=request.stream,
            include_usage=bool(request.stream and options and options.include_usage),
            plan=plan,
            constraint=self._constraint(plan),
        )

    def _constraint(self, plan: ReplyPlan) -> Any:
        """Return the token constraint of a reply with an output format, on an engine that
        samples (``None`` otherwise: the sim emits a schema-valid reply instead).

        Raises:
            APIError: 400 naming the field when the engine cannot constrain its decoding
                or the format does not compile.
        """
        if plan.output_format is None or not self._runtime.samples_tokens:
            return None
        from pbkv.engines.constrained import (
            ConstraintUnavailable,
            TokenConstraint,
            smollm2_tokenizer,
        )

        param = "response_format" if plan.tool_choice in ("auto", "none") else "tool_choice"
        engine = getattr(self._runtime, "engine", None)
        if not getattr(engine, "constrains_tokens", False):
            raise APIError(
                400,
                f"{param}: this engine has no constrained decoding",
                param=param,
                code="unsupported_parameter",
            )
        try:
            return TokenConstraint(plan.output_format, smollm2_tokenizer())
        except ConstraintUnavailable as exc:
            raise APIError(
                400, f"{param}: {exc}", param=param, code="unsupported_parameter"
            ) from None
        except ValueError as exc:
            raise APIError(400, f"{param}: {exc}", param=param) from None

    async def _serve(
        self,
        scope: Scope,
        request: ChatCompletionRequest | CompletionRequest | ResponsesRequest,
        endpoint: str,
        prompt: str | list[dict[str, Any]],
        responder: _Responder,
        plan: ReplyPlan = _TEXT,
    ) -> None:
        if self.draining:
            raise self._draining_error()
        self._check_model(request.model)
        generation = await self._generation(endpoint, request, prompt, plan)
        hints = self._hints(scope, request)
        generation = self._simulate(generation, hints, prompt)
        if self._config.fault_injection and _fault_header(scope) is not None:
            generation = dataclasses.replace(generation, inject_fault=True)
        self._generating += 1  # what a drain waits for
        try:
            async with self._sessions.workflow(hints) as lease:
                headers = [(b"x-pbkv-workflow-id", lease.workflow_id.encode())]
                if endpoint == "responses":
                    assert isinstance(request, ResponsesRequest)
                    await self._respond(lease, hints.agent, generation, request, responder, headers)
                elif generation.stream:
                    await self._stream(lease, hints.agent, generation, responder, headers)
                else:
                    await self._whole(lease, hints.agent, generation, responder, headers)
        except Exception as exc:
            if _never_fits(exc):
                raise self._tier_error(exc, generation) from exc
            raise
        finally:
            self._generating -= 1

    def _simulate(
        self, generation: _Generation, hints: Hints, prompt: str | list[dict[str, Any]]
    ) -> _Generation:
        """Return ``generation`` with the sim engine's reply text, where it has one
        (:func:`pbkv.server.toolcalls.simulated_text`)."""
        if self._runtime.samples_tokens or isinstance(prompt, str):
            return generation
        context = ReplyContext(hints.agent, hints.workflow_id, tuple(prompt), generation.plan)
        text = simulated_text(generation.plan, context, self._config.reply_source)
        if text is None:
            return generation
        from pbkv.live import Simulated

        return dataclasses.replace(generation, simulated=Simulated(text=text))

    def _gpu_tier_tokens(self) -> int:
        """Tokens the GPU KV tier holds (0 where the engine's KV manager says none)."""
        kv = getattr(self._runtime, "kv", None)
        config = getattr(kv, "config", None)
        if config is None:
            return 0
        return int(config.gpu_capacity_blocks) * int(config.block_size)

    def _tier_error(self, exc: Exception, generation: _Generation) -> APIError:
        """Return the 400 of a request that can never fit the GPU KV tier, naming the
        prompt, or the budget when the prompt alone would fit."""
        param, tier = generation.prompt_param, self._gpu_tier_tokens()
        prompt, budget = generation.prompt_tokens, generation.max_new_tokens
        if not tier:
            message = f"the request never fits the GPU KV cache tier ({exc})"
        else:
            if prompt + 1 <= tier:
                param = generation.budget_param
            message = (
                f"the request needs {prompt + budget} tokens of KV cache ({prompt} in the "
                f"prompt, {budget} to generate); the GPU KV cache tier holds {tier}"
            )
        return APIError(400, f"{param}: {message}", param=param, code="context_length_exceeded")

    def _stop_watch(self, generation: _Generation) -> Callable[[int], bool] | None:
        """Return what ends decoding at the token completing a stop sequence, if any
        (one that raises :class:`InjectedFault` for a request with a fault injected)."""
        if generation.inject_fault:
            return _failing_until
        watch = StopWatch(generation.stops, self._runtime.chat.decode) if generation.stops else None
        if generation.constraint is not None:
            return _Constrained(generation.constraint, watch)
        return watch

    def _finish_reason(
        self, reply: Any, generation: _Generation, cutter: StopCutter, calls: int = 0
    ) -> str:
        """Return OpenAI's ``finish_reason``: ``tool_calls`` when the reply holds tool
        calls, ``stop`` at a stop sequence or the end of turn, ``length`` when the reply
        used up ``max_tokens`` without either.

        The sim engine samples nothing: its reply is filler up to the budget, closed by
        an end-of-turn marker that is part of the filler, so it ends by ``length``; a
        simulated reply (scripted, or a schema-valid one) ends by ``stop``.
        """
        if calls:
            return "tool_calls"
        if cutter.stopped or generation.simulated is not None:
            return "stop"
        if not self._runtime.samples_tokens:
            return "length" if len(reply.token_ids) >= generation.max_new_tokens else "stop"
        return str(reply.finish_reason)

    async def _respond(
        self,
        lease: Lease,
        agent: str,
        generation: _Generation,
        request: ResponsesRequest,
        responder: _Responder,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Serve a Responses API request, whole or as its stream of events."""
        builder = ResponseBuilder(request, self.model)
        parser = make_tool_parser(self._config.tool_call_parser)
        parse = generation.plan.parse_calls
        chat = self._runtime.chat
        if not generation.stream:
            reply = await self._call(lease, agent, generation)
            text = streamed_text(reply.token_ids, chat.decode, chat.stop_text)
            parsed = parse_reply(parser, text) if parse else None
            content = parsed.content if parsed else text
            calls = parsed.calls if parsed else ()
            finish = self._finish_reason(reply, generation, StopCutter(), len(calls))
            usage = response_usage(_usage(reply))
            await lease.settle()
            record = builder.whole(content, calls, finish, usage)
            await responder.whole(200, encode(record), headers)
            return

        async def send(events: list[tuple[str, dict[str, Any]]]) -> None:
            for name, event in events:
                await responder.event(msgspec.json.encode(event), name)

        async with self._stream_call(lease, agent, generation) as stream:
            async for delta in stream:
                if not responder.started:
                    await responder.start_events(headers)
                    await send(builder.opening())
                await send(builder.pieces(parser.feed(delta.text) if parse else [delta.text]))
            reply = stream.reply
        if not responder.started:
            await responder.start_events(headers)
            await send(builder.opening())
        await lease.settle()
        await send(builder.pieces(parser.finish() if parse else []))
        finish = self._finish_reason(reply, generation, StopCutter(), builder.calls)
        await send(builder.closing(finish, response_usage(_usage(reply))))
        await responder.end_events()

    async def _call(self, lease: Lease, agent: str, generation: _Generation) -> Any:
        """Run ``generation`` as one call of the lease's workflow; return its reply."""
        return await lease.workflow.call(
            agent,
            generation.prompt,
            max_new_tokens=generation.max_new_tokens,
            sampling=generation.sampling,
            until=self._stop_watch(generation),
            simulated=generation.simulated,
        )

    def _stream_call(self, lease: Lease, agent: str, generation: _Generation) -> Any:
        """Run ``generation`` as one streamed call (``async with ... as stream``)."""
        return lease.workflow.stream(
            agent,
            generation.prompt,
            max_new_tokens=generation.max_new_tokens,
            sampling=generation.sampling,
            until=self._stop_watch(generation),
            simulated=generation.simulated,
        )

    def _ident(self, endpoint: str) -> str:
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        return f"{prefix}-{secrets.token_hex(12)}"

    async def _whole(
        self,
        lease: Lease,
        agent: str,
        generation: _Generation,
        responder: _Responder,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        reply = await self._call(lease, agent, generation)
        cutter = StopCutter(generation.stops)
        chat = self._runtime.chat
        text = cutter.feed(streamed_text(reply.token_ids, chat.decode, chat.stop_text))
        text += cutter.flush()
        content: str | None = text
        calls: list[ToolCall] = []
        if generation.plan.parse_calls:
            parsed = parse_reply(make_tool_parser(self._config.tool_call_parser), text)
            content, calls = parsed.content, [_tool_call(c) for c in parsed.calls]
        finish = self._finish_reason(reply, generation, cutter, len(calls))
        ident, created = self._ident(generation.endpoint), int(time.time())
        if generation.endpoint == "chat":
            choice = ChatChoice(0, AssistantMessage(content, tool_calls=calls or None), finish)
            record: Any = ChatCompletion(ident, created, self.model, [choice], _usage(reply))
        else:
            choices = [TextChoice(0, text, finish)]
            record = Completion(ident, created, self.model, choices, _usage(reply))
        await lease.settle()
        await responder.whole(200, encode(record), headers)

    async def _stream(
        self,
        lease: Lease,
        agent: str,
        generation: _Generation,
        responder: _Responder,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        frames = _Frames(generation.endpoint, self._ident(generation.endpoint), self.model)
        cutter = StopCutter(generation.stops)
        parser = (
            make_tool_parser(self._config.tool_call_parser) if generation.plan.parse_calls else None
        )
        async with self._stream_call(lease, agent, generation) as stream:
            async for delta in stream:
                if not responder.started:  # errors before the first token answer as JSON
                    await responder.start_events(headers)
                    await frames.open(responder)
                piece = cutter.feed(delta.text)
                if piece:
                    await frames.send(responder, parser.feed(piece) if parser else [piece])
            reply = stream.reply
        if not responder.started:
            await responder.start_events(headers)
            await frames.open(responder)
        await lease.settle()
        tail = cutter.flush()
        pieces: list[Any] = [tail] if tail else []
        if parser is not None:
            pieces = (parser.feed(tail) if tail else []) + parser.finish()
        await frames.send(responder, pieces)
        finish = self._finish_reason(reply, generation, cutter, frames.calls)
        await responder.event(frames.finish(finish))
        if generation.include_usage:
            await responder.event(frames.usage(_usage(reply)))
        await responder.end_events()


class _Frames:
    """Builds the stream chunks of one chat or text completion."""

    def __init__(self, endpoint: str, ident: str, model: str) -> None:
        self._chat = endpoint == "chat"
        self._ident = ident
        self._model = model
        self._created = int(time.time())
        self.calls = 0  # tool calls sent

    def _chunk(self, choices: list[Any], usage: Usage | None = None) -> Any:
        if self._chat:
            return ChatCompletionChunk(self._ident, self._created, self._model, choices, usage)
        return Completion(self._ident, self._created, self._model, choices, usage)

    async def open(self, responder: _Responder) -> None:
        if self._chat:  # OpenAI's first chat chunk carries the role
            delta = ChunkDelta(content="", role="assistant")
            await responder.event(self._chunk([ChunkChoice(0, delta)]))

    async def send(self, responder: _Responder, pieces: Sequence[str | ParsedCall]) -> None:
        """Send parsed pieces: content text, and each tool call whole as one delta."""
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                call = _tool_call(piece)
                delta = ToolCallDelta(self.calls, call.id, call.function, "function")
                self.calls += 1
                await responder.event(self._chunk([ChunkChoice(0, ChunkDelta(tool_calls=[delta]))]))
            elif piece:
                await responder.event(self.piece(piece))

    def piece(self, text: str) -> Any:
        if self._chat:
            return self._chunk([ChunkChoice(0, ChunkDelta(content=text))])
        return self._chunk([TextChoice(0, text)])

    def finish(self, reason: str) -> Any:
        if self._chat:
            return self._chunk([ChunkChoice(0, ChunkDelta(), reason)])
        return self._chunk([TextChoice(0, "", reason)])

    def usage(self, usage: Usage) -> Any:
        return self._chunk([], usage)


class _Constrained:
    """The ``until`` of a constrained reply: stop sequences (if any) end it, and its
    ``constraint`` is what the engine masks its logits with
    (:func:`pbkv.engines.constrained.request_constraint`)."""

    def __init__(self, constraint: Any, watch: StopWatch | None) -> None:
        self.constraint = constraint
        self._watch = watch

    def __call__(self, token: int) -> bool:
        return self._watch(token) if self._watch is not None else False


def _tool_call(call: ParsedCall) -> ToolCall:
    """Return a parsed call as a reply's tool call, with a fresh id."""
    return ToolCall(f"call_{secrets.token_hex(12)}", FunctionCall(call.name, call.arguments))


def _message_dict(message: Any) -> dict[str, Any]:
    """Return a request's message as the chat template takes it (role, text, tool calls)."""
    out: dict[str, Any] = {
        "role": _ROLES.get(message.role, message.role),
        "content": message.text(),
    }
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _refuse_unserved(request: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse a request for what pbkv serve does not do, naming the field (400
    ``unsupported_parameter``): the legacy ``functions`` / ``function_call`` (``tools``
    are served), a ``response_format`` on completions, logprobs, non-zero penalties,
    ``logit_bias``, audio, non-text message parts, and on completions ``echo``,
    ``best_of`` > 1 and ``suffix``. Their neutral values (no functions or
    ``function_call: "none"``, ``{"type": "text"}``, ``false``/0/empty) are accepted."""

    def refuse(param: str, message: str) -> APIError:
        return APIError(
            400,
            f"{param}: {message}; pbkv serve does not serve it",
            param=param,
            code="unsupported_parameter",
        )

    if isinstance(request, ChatCompletionRequest):
        choice = request.function_call
        if choice is not None and choice not in ("none", "auto"):
            raise refuse("function_call", f"function_call {choice!r} (send tools instead)")
        if request.functions and choice != "none":
            raise refuse("functions", "the legacy functions (send tools instead)")
        for i, message in enumerate(request.messages):
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if part.type != "text":
                        param = f"messages[{i}].content[{j}].type"
                        raise refuse(param, f"a {part.type!r} part (only text is served)")
        if request.modalities and set(request.modalities) - {"text"}:
            raise refuse("modalities", f"modalities {request.modalities!r} (only text)")
    else:
        if request.echo:
            raise refuse("echo", "echoing the prompt")
        if request.best_of is not None and request.best_of > 1:
            raise refuse("best_of", f"best_of {request.best_of}")
        if request.suffix:
            raise refuse("suffix", "a suffix (insertion)")
    kind = (request.response_format or {}).get("type", "text")
    if kind != "text" and not isinstance(request, ChatCompletionRequest):
        raise refuse("response_format", f"response_format {kind!r} on completions")
    if request.logprobs is not None and request.logprobs is not False:
        raise refuse("logprobs", "logprobs")
    if request.top_logprobs:
        raise refuse("top_logprobs", "top_logprobs")
    if request.logit_bias:
        raise refuse("logit_bias", "a logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            raise refuse(name, f"a non-zero {name}")
