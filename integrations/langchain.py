"""A LangChain chat model that tells ``pbkv serve`` which LangGraph thread and node call it.

Needs ``langchain-openai`` (the ``serve`` extra). A LangGraph app changes one line::

    llm = pbkv.integrations.langchain.chat_model(base_url="http://127.0.0.1:8000/v1",
                                                 model="tiny")

and every call made inside a node then carries ``{"pbkv": {"workflow_id": thread_id,
"agent": node}}`` in its body (LangGraph's ``thread_id`` and ``langgraph_node`` run
metadata, read from the callback manager the model is called with; LangChain streams
(``llm.stream``, and ``invoke`` under ``graph.stream(stream_mode="messages")``) call the
model without one, and then the metadata is read from the run config LangChain keeps for
the code running now, ``ensure_config()``). Hints already in ``extra_body`` win; calls
outside a graph carry none (one-request workflows).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables.config import ensure_config
from langchain_openai import ChatOpenAI

from pbkv.integrations.hints import langgraph_hints


class ChatPBKV(ChatOpenAI):
    """``ChatOpenAI`` that adds pbkv workflow hints from the LangGraph run metadata."""

    def _with_hints(self, run_manager: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        metadata = getattr(run_manager, "metadata", None)
        if run_manager is None:  # langchain_core's stream paths pass none
            metadata = ensure_config().get("metadata")
        hints = langgraph_hints(metadata or {})
        if not hints:
            return kwargs
        extra = {**(self.extra_body or {}), **(kwargs.get("extra_body") or {})}
        extra["pbkv"] = {**hints, **(extra.get("pbkv") or {})}
        return {**kwargs, "extra_body": extra}

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any):
        kwargs = self._with_hints(run_manager, kwargs)
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ):
        kwargs = self._with_hints(run_manager, kwargs)
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def _stream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[Any]:
        kwargs = self._with_hints(run_manager, kwargs)
        yield from super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _astream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        kwargs = self._with_hints(run_manager, kwargs)
        async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs):
            yield chunk


def chat_model(*, base_url: str, model: str, api_key: str = "pbkv", **kwargs: Any) -> ChatPBKV:
    """Return a chat model for ``pbkv serve`` at ``base_url`` (``http://HOST:PORT/v1``).

    Args:
        base_url: the server's OpenAI base URL.
        model: the served model name (``GET /v1/models``).
        api_key: sent as ``Authorization: Bearer``; picks the tenant when the server maps
            keys to tenants.
        **kwargs: passed to ``ChatOpenAI`` (``temperature``, ``max_tokens``, ``timeout``...).
    """
    return ChatPBKV(base_url=base_url, model=model, api_key=api_key, **kwargs)
