"""How ``pbkv serve`` listens and serves: :class:`ServerConfig`, checked when built."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pbkv.server.toolcalls import ReplySource
from pbkv.server.toolparsers import make_tool_parser


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
