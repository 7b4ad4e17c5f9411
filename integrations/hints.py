"""Workflow hints as an OpenAI client sends them: ``extra_body`` or ``extra_headers``.

Plain functions, no framework import. The names mirror the server's (§7.4):
``{"pbkv": {"workflow_id", "agent", "final"}}`` in the body, or ``X-PBKV-Workflow-Id``,
``X-PBKV-Agent`` and ``X-PBKV-Final`` headers.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def hint_body(
    workflow_id: str | None = None, agent: str | None = None, *, final: bool = False
) -> dict[str, Any]:
    """Return ``extra_body`` for an OpenAI call: ``{"pbkv": {...}}`` with the given hints."""
    hints: dict[str, Any] = {}
    if workflow_id is not None:
        hints["workflow_id"] = str(workflow_id)
    if agent is not None:
        hints["agent"] = agent
    if final:
        hints["final"] = True
    return {"pbkv": hints}


def hint_headers(
    workflow_id: str | None = None, agent: str | None = None, *, final: bool = False
) -> dict[str, str]:
    """Return ``extra_headers`` (or ``default_headers``) carrying the given hints."""
    headers: dict[str, str] = {}
    if workflow_id is not None:
        headers["X-PBKV-Workflow-Id"] = str(workflow_id)
    if agent is not None:
        headers["X-PBKV-Agent"] = agent
    if final:
        headers["X-PBKV-Final"] = "true"
    return headers


PREBUILT_NODES = frozenset({"agent", "model"})
"""The LLM node names of LangGraph's prebuilt agents (``create_react_agent``: ``agent``;
LangChain's ``create_agent``: ``model``): a call from one is named by the node that holds
the agent (``langgraph_checkpoint_ns``)."""


def _checkpoint_path(namespace: str) -> list[str]:
    """Return the node names of a ``langgraph_checkpoint_ns`` (``a:<id>|b:<id>`` → a, b)."""
    return [part.split(":", 1)[0] for part in namespace.split("|") if part]


def end_workflow(
    base_url: str,
    workflow_id: str,
    *,
    api_key: str = "pbkv",
    cache_salt: str | None = None,
    timeout_s: float = 10.0,
) -> bool:
    """End a workflow of ``pbkv serve`` without generating (``POST
    /v1/pbkv/workflows/{id}/end``): what a framework's run-end hook calls.

    Args:
        base_url: the server's OpenAI base URL (``http://HOST:PORT/v1``).
        workflow_id: the workflow's id, as its calls sent it.
        api_key: the API key its calls used (the tenant).
        cache_salt: the ``cache_salt`` its calls sent, if any.
        timeout_s: how long the request may take.

    Returns:
        Whether it was open and is now ended; a failure (the server gone, the workflow
        already ended) is logged, never raised.
    """
    import httpx

    quoted = urllib.parse.quote(str(workflow_id), safe="")
    url = f"{base_url.rstrip('/')}/pbkv/workflows/{quoted}/end"
    body = {"cache_salt": cache_salt} if cache_salt else {}
    try:
        response = httpx.post(
            url, json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        log.warning("could not end workflow %s: %s", workflow_id, exc)
        return False
    if response.status_code != 200:
        log.info("ending workflow %s: %s %s", workflow_id, response.status_code, response.text)
    return response.status_code == 200


def langgraph_hints(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``pbkv`` hints found in a LangGraph run's metadata.

    LangGraph copies the config's ``thread_id`` into every run's metadata and stamps each
    node's runs with ``langgraph_node`` (its name) and ``langgraph_checkpoint_ns`` (the
    path of nodes to it, ``researcher:<id>|agent:<id>``); the chat model sees the merged
    metadata on its callback manager. A nested graph's node name is the node's own,
    except a prebuilt agent's LLM node (:data:`PREBUILT_NODES`), named by the node
    that holds the agent (``researcher``), so every prebuilt agent does not arrive as
    ``agent``.

    Args:
        metadata: the run metadata (``run_manager.metadata``).

    Returns:
        ``{"workflow_id": ..., "agent": ...}`` with the keys that were present.
    """
    hints: dict[str, Any] = {}
    if metadata.get("thread_id") is not None:
        hints["workflow_id"] = str(metadata["thread_id"])
    node = metadata.get("langgraph_node")
    if node:
        path = _checkpoint_path(str(metadata.get("langgraph_checkpoint_ns") or ""))
        if node in PREBUILT_NODES and len(path) > 1 and path[-1] == node:
            node = path[-2]
        hints["agent"] = str(node)
    return hints
