"""Workflow hints as an OpenAI client sends them: ``extra_body`` or ``extra_headers``.

Plain functions, no framework import. The names mirror the server's (§7.4):
``{"pbkv": {"workflow_id", "agent", "final"}}`` in the body, or ``X-PBKV-Workflow-Id``,
``X-PBKV-Agent`` and ``X-PBKV-Final`` headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def langgraph_hints(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Return the ``pbkv`` hints found in a LangGraph run's metadata.

    LangGraph copies the config's ``thread_id`` into every run's metadata and stamps each
    node's runs with ``langgraph_node`` (its name); the chat model sees the merged
    metadata on its callback manager. A nested graph's node name is the node's own.

    Args:
        metadata: the run metadata (``run_manager.metadata``).

    Returns:
        ``{"workflow_id": ..., "agent": ...}`` with the keys that were present.
    """
    hints: dict[str, Any] = {}
    if metadata.get("thread_id") is not None:
        hints["workflow_id"] = str(metadata["thread_id"])
    if metadata.get("langgraph_node"):
        hints["agent"] = str(metadata["langgraph_node"])
    return hints
