"""The ASGI application of ``pbkv serve``: OpenAI-compatible routes over a live runtime.

Run by hypercorn's trio worker in pbkv's own nursery. Each request is authenticated and
routed first, then read whole (:mod:`pbkv.server.asgi`), decoded once into a typed record
(:mod:`pbkv.server.schemas`), checked into a generation (:mod:`pbkv.server.generation`),
resolved to a workflow and agent (:mod:`pbkv.server.hints`) and served as one call of that
live workflow (:mod:`pbkv.server.replies`). While it runs, a watcher reads the ASGI
channel: a client that disconnects cancels the request, which cancels the engine request
and releases its cache leases. Any failure is answered as an OpenAI-style error body
(:mod:`pbkv.server.failures`), never a crash. The app also answers ``/v1/models``,
``/health``, ``/stats``, ``/metrics`` and the workflow end hook, and drains at shutdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import msgspec
import trio

from pbkv.server.asgi import (
    BodyReader,
    Disconnected,
    Receive,
    Responder,
    Scope,
    Send,
    content_length,
    request_headers,
    routed_path,
    watch_disconnect,
)
from pbkv.server.config import ServerConfig
from pbkv.server.errors import APIError, decode_body
from pbkv.server.failures import as_api_error, draining_error, fault_header, never_fits
from pbkv.server.generation import (
    TEXT_REPLY,
    build_generation,
    gpu_tier_tokens,
    message_dict,
    tier_error,
    with_simulated_reply,
)
from pbkv.server.hints import Hints, bearer_key, key_tenant, resolve_hints
from pbkv.server.replies import Replier
from pbkv.server.responses import RESPONSES_DECODER, ResponsesRequest, chat_view
from pbkv.server.schemas import (
    CHAT_DECODER,
    COMPLETION_DECODER,
    WORKFLOW_END_DECODER,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    WorkflowHints,
    encode,
)
from pbkv.server.sessions import SessionRegistry
from pbkv.server.stats import HTTPCounters, prometheus_text, serving, snapshot
from pbkv.server.toolcalls import ReplyPlan, reply_plan

log = logging.getLogger(__name__)

_OPEN_PATHS = frozenset({"/health", "/metrics"})  # answered without an API key


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


class _Accepted(NamedTuple):
    """A request let in: its route template, handler and body."""

    route: str
    handler: Callable[..., Awaitable[None]]
    body: bytes


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
        self._body = BodyReader(config.max_body_bytes, config.body_timeout_s)
        self._replier = Replier(runtime, self.model, config.tool_call_parser)
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
        elif scope["type"] == "websocket":
            await self._refuse_websocket(scope, receive, send)

    @staticmethod
    async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a WebSocket (the Responses API's WebSocket mode is not served): a 404
        with an OpenAI-style body through ASGI's ``websocket.http.response`` extension,
        which hypercorn offers; a close before accepting (403) where it is absent."""
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        error = APIError(404, f"{scope.get('path', '')} is not served over WebSocket; use HTTP")
        headers = [(b"content-type", b"application/json")]
        await send({"type": "websocket.http.response.start", "status": 404, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": error.body()})

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
        responder = Responder(send)
        route = "unrouted"
        self.http.in_flight += 1
        request_scope = trio.CancelScope()
        self._requests.add(request_scope)
        try:
            with request_scope:
                async with trio.open_nursery() as nursery:
                    try:
                        route, handler, body = await self._accept(scope, receive)
                        nursery.start_soon(watch_disconnect, receive, request_scope, responder)
                        await handler(scope, body, responder)
                    except Disconnected:
                        request_scope.cancel()
                    except Exception as exc:  # answered as an error body, never a crash
                        await self._answer_error(responder, exc)
                    nursery.cancel_scope.cancel()
            if request_scope in self._cut and not responder.done:
                await self._answer_error(responder, draining_error(self._config.retry_after_s))
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
        :attr:`BodyReader.drained_bytes` and while it keeps arriving: a client still
        sending then reads the refusal, and over HTTP/2 its connection stays usable (an
        answer sent before the body ends leaves DATA frames for a closed stream).

        Returns:
            The route template, its handler and the body.

        Raises:
            APIError: the refusal; 413 for a body over ``max_body_bytes``; 408 for one
                of which nothing arrives for ``body_timeout_s``.
            Disconnected: the client went away first.
        """
        refusal: APIError | None = None
        declared = content_length(scope)
        try:
            path = routed_path(scope["path"])
            self._authenticate(scope, path)
            route, handler = self._route(scope["method"], path)
            if declared > self._config.max_body_bytes:
                raise self._body.too_large()
        except APIError as exc:
            refusal = exc
        if refusal is None:
            return _Accepted(route, handler, await self._body.read(receive))
        if declared <= self._body.drained_bytes:
            with contextlib.suppress(APIError):  # too long or too slow: refused as it is
                await self._body.read(receive, keep=False)
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
        headers = request_headers(scope)
        if path == "/stats" and self._is_admin(headers):
            return
        if self._config.api_keys is not None:
            key_tenant(headers, self._config.api_keys)

    def _is_admin(self, headers: Mapping[str, str]) -> bool:
        """Whether the request's key is the admin key."""
        admin, key = self._config.admin_key, bearer_key(headers)
        return admin is not None and key is not None and secrets.compare_digest(key, admin)

    async def _answer_error(self, responder: Responder, exc: Exception) -> None:
        error = as_api_error(exc, self._config.retry_after_s)
        if responder.events:  # headers are sent: the error travels as an event
            await responder.event(error.body())
            await responder.end_events()
        elif not responder.started:
            await responder.whole(error.status, error.body(), error.headers())

    # Routes

    async def _health(self, scope: Scope, body: bytes, responder: Responder) -> None:
        if self.draining:
            raise draining_error(self._config.retry_after_s)
        await responder.whole(200, encode({"status": "ok", "model": self.model}))

    async def _health_head(self, scope: Scope, body: bytes, responder: Responder) -> None:
        if self.draining:
            raise draining_error(self._config.retry_after_s)
        await responder.whole(200, b"")

    async def _models(self, scope: Scope, body: bytes, responder: Responder) -> None:
        cards = [ModelCard(name, self._created) for name in self.model_names]
        await responder.whole(200, encode(ModelList(cards)))

    async def _model(self, scope: Scope, body: bytes, responder: Responder) -> None:
        name = scope["path"].rstrip("/").removeprefix("/v1/models/")
        self._check_model(name)
        await responder.whole(200, encode(ModelCard(name, self._created)))

    async def _end(self, scope: Scope, body: bytes, responder: Responder) -> None:
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
        headers = request_headers(scope)
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

    async def _stats(self, scope: Scope, body: bytes, responder: Responder) -> None:
        """Answer the statistics with the workflows the caller may see: every tenant's
        for the admin key, the key's tenant's for another key, and without keys the
        default tenant's (a ``cache_salt`` is a secret; its workflows are not listed)."""
        headers = request_headers(scope)
        admin = self._is_admin(headers)
        tenant = None if admin else key_tenant(headers, self._config.api_keys)
        await responder.whole(200, msgspec.json.encode(self.statistics(tenant)))

    async def _metrics(self, scope: Scope, body: bytes, responder: Responder) -> None:
        text = prometheus_text(
            runtime_stats=self._runtime.statistics(),
            sessions=self._sessions.statistics(),
            http=self.http,
            served=serving(self._runtime),
        ).encode()
        await responder.whole(
            200, text, content_type=(b"content-type", b"text/plain; version=0.0.4")
        )

    async def _chat(self, scope: Scope, body: bytes, responder: Responder) -> None:
        request = decode_body(CHAT_DECODER, body)
        plan = reply_plan(request.tools, request.tool_choice, request.response_format)
        messages = [message_dict(m) for m in request.messages]
        await self._serve(scope, request, "chat", messages, responder, plan)

    async def _responses(self, scope: Scope, body: bytes, responder: Responder) -> None:
        request = decode_body(RESPONSES_DECODER, body)
        view = chat_view(request)
        plan = reply_plan(view.tools, view.tool_choice, view.response_format)
        await self._serve(scope, request, "responses", view.messages, responder, plan)

    async def _completions(self, scope: Scope, body: bytes, responder: Responder) -> None:
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
        headers = request_headers(scope)
        tenant = key_tenant(headers, self._config.api_keys)
        return resolve_hints(headers, request.pbkv, cache_salt=request.cache_salt, tenant=tenant)

    async def _serve(
        self,
        scope: Scope,
        request: ChatCompletionRequest | CompletionRequest | ResponsesRequest,
        endpoint: str,
        prompt: str | list[dict[str, Any]],
        responder: Responder,
        plan: ReplyPlan = TEXT_REPLY,
    ) -> None:
        if self.draining:
            raise draining_error(self._config.retry_after_s)
        self._check_model(request.model)
        generation = await build_generation(
            self._runtime,
            endpoint,
            request,
            prompt,
            plan,
            default_max_tokens=self._config.default_max_tokens,
        )
        hints = self._hints(scope, request)
        generation = with_simulated_reply(
            self._runtime, generation, hints, prompt, self._config.reply_source
        )
        if self._config.fault_injection and fault_header(scope) is not None:
            generation = dataclasses.replace(generation, inject_fault=True)
        self._generating += 1  # what a drain waits for
        try:
            async with self._sessions.workflow(hints) as lease:
                headers = [(b"x-pbkv-workflow-id", lease.workflow_id.encode())]
                if endpoint == "responses":
                    assert isinstance(request, ResponsesRequest)
                    await self._replier.respond(
                        lease, hints.agent, generation, request, responder, headers
                    )
                elif generation.stream:
                    await self._replier.stream(lease, hints.agent, generation, responder, headers)
                else:
                    await self._replier.whole(lease, hints.agent, generation, responder, headers)
        except Exception as exc:
            if never_fits(exc):
                raise tier_error(exc, generation, gpu_tier_tokens(self._runtime)) from exc
            raise
        finally:
            self._generating -= 1
