"""Who is calling: workflow hints from headers, the ``pbkv`` body object and the API key.

Plain code, no trio. Headers (``X-PBKV-Workflow-Id``, ``X-PBKV-Agent``, ``X-PBKV-Final``;
Dynamo's ``X-Dynamo-Session-ID`` / ``X-Dynamo-Session-Final`` as aliases) suit clients
that set them once per client (AutoGen: one client per agent); the ``pbkv`` body object,
sent through OpenAI clients' ``extra_body``, suits per-call hints and wins over headers.
The tenant (cache namespace, never shared) is the API key's tenant and/or the body's
``cache_salt`` (vLLM's field): a salt namespaces within its key's tenant, so a salt can
never reach another key's cache.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from pbkv.server.errors import APIError
from pbkv.server.schemas import MAX_HINT_CHARS, WorkflowHints

DEFAULT_AGENT = "assistant"
WORKFLOW_HEADERS = ("x-pbkv-workflow-id", "x-dynamo-session-id")
FINAL_HEADERS = ("x-pbkv-final", "x-dynamo-session-final")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class Hints(NamedTuple):
    """The resolved identity of one request.

    Args:
        workflow_id: the client's workflow id, or ``None``: a one-request workflow.
        agent: the calling agent's name (``assistant`` when not given).
        final: the workflow ends after this request.
        tenant: the cache namespace (``""``: the shared default namespace).
        account: who the request counts against in per-tenant limits: the API key's
            tenant, or without keys the ``cache_salt`` (``""`` when none).
    """

    workflow_id: str | None
    agent: str
    final: bool
    tenant: str
    account: str = ""


def _flag(name: str, value: str) -> bool:
    folded = value.strip().lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise APIError(400, f"header {name}: expected true or false, got {value!r}", param=name)


def _bounded(name: str, value: str) -> str:
    value = value.strip()
    if len(value) > MAX_HINT_CHARS:
        raise APIError(400, f"header {name}: longer than {MAX_HINT_CHARS} characters", param=name)
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _body_hint(name: str, value: str | None) -> str | None:
    """A body hint with surrounding spaces dropped, as a header's are (``None`` if blank)."""
    if value is None:
        return None
    return value.strip() or None


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """Return the API key of an ``Authorization: Bearer KEY`` header, or ``None``."""
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def key_tenant(headers: Mapping[str, str], api_keys: Mapping[str, str] | None) -> str:
    """Return the tenant of the request's API key.

    Args:
        headers: request headers, names lower-case.
        api_keys: API key → tenant; ``None`` serves every key (and none) as tenant ``""``.

    Raises:
        APIError: 401 when ``api_keys`` is set and the key is missing or unknown.
    """
    if api_keys is None:
        return ""
    key = bearer_key(headers)
    if key is None or key not in api_keys:
        raise APIError(
            401,
            "missing or unknown API key (send Authorization: Bearer KEY)",
            type="authentication_error",
            code="invalid_api_key",
        )
    return api_keys[key]


def resolve_hints(
    headers: Mapping[str, str],
    body: WorkflowHints | None,
    *,
    cache_salt: str | None,
    tenant: str,
) -> Hints:
    """Merge header and body hints into one :class:`Hints`: a hint the body gives wins
    over the header's (``"final": false`` in the body beats ``X-PBKV-Final: true``).

    Args:
        headers: request headers, names lower-case.
        body: the request's ``pbkv`` object, if any.
        cache_salt: the request's ``cache_salt``, if any.
        tenant: the API key's tenant (:func:`key_tenant`).

    Raises:
        APIError: 400 for a final flag that is not true/false or an over-long header.
    """
    workflow_id = next(
        (_bounded(h, headers[h]) for h in WORKFLOW_HEADERS if headers.get(h, "").strip()), None
    )
    agent = _bounded("x-pbkv-agent", headers.get("x-pbkv-agent", "")) or None
    final = any(_flag(h, headers[h]) for h in FINAL_HEADERS if h in headers)
    if body is not None:
        workflow_id = _body_hint("workflow_id", body.workflow_id) or workflow_id
        agent = _body_hint("agent", body.agent) or agent
        final = final if body.final is None else body.final
    for name, value in (("workflow_id", workflow_id), ("agent", agent)):
        if value is not None and _CONTROL.search(value):
            raise APIError(
                400,
                f"{name} {value!r}: control characters (newline, NUL...) are not allowed",
                param=f"pbkv.{name}",
            )
    account = tenant or cache_salt or ""
    if cache_salt:
        tenant = f"{tenant}/{cache_salt}" if tenant else cache_salt
    return Hints(workflow_id, agent or DEFAULT_AGENT, final, tenant, account)
