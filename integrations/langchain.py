"""LangChain / LangGraph: a chat model that tells ``pbkv serve`` which run and node call
it, and a callback that ends the run's workflow when the run ends.

Needs ``langchain-openai`` (the ``serve`` extra). A LangGraph app changes two lines::

    llm = pbkv.integrations.langchain.chat_model(base_url="http://127.0.0.1:8000/v1",
                                                 model="tiny")
    hook = pbkv.integrations.langchain.WorkflowEnds(base_url="http://127.0.0.1:8000/v1")
    graph.invoke(inputs, {"callbacks": [hook]})

Every call made inside a node then carries ``{"pbkv": {"workflow_id": ..., "agent":
node}}`` in its body: the workflow is LangGraph's ``thread_id``, or without one the id
of the run's root (known to the hook), and the agent the node's name, a prebuilt agent's
LLM node named by the node holding the agent (:func:`pbkv.integrations.langgraph_hints`).
The metadata is read from the callback manager the model is called with; LangChain
streams (``llm.stream``, and ``invoke`` under ``graph.stream(stream_mode="messages")``)
call the model without one, and then from the run config LangChain keeps for the code
running now, ``ensure_config()``. Hints already in ``extra_body`` win; calls outside a
graph carry none (one-request workflows).

When the root run ends (returns or raises), :class:`WorkflowEnds` calls ``POST
/v1/pbkv/workflows/{id}/end`` for each workflow its calls used, so their cache retires
at once instead of at the idle timeout.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables.config import ensure_config
from langchain_openai import ChatOpenAI

from pbkv.integrations.hints import end_workflow, langgraph_hints


class WorkflowEnds(BaseCallbackHandler):
    """A LangChain callback that ends each run's pbkv workflow when the run ends.

    Pass it in the config of the root run (``graph.invoke(x, {"callbacks": [hook]})``);
    LangChain hands it to every run below. It keeps each run's root, so a
    :class:`ChatPBKV` call without a ``thread_id`` uses the root run's id as its
    workflow; when the root run ends it ends every workflow its calls used. A failed
    end (the server gone, the workflow already ended by the idle timeout) is logged,
    never raised into the app.

    Args:
        base_url: the server's OpenAI base URL (``http://HOST:PORT/v1``).
        api_key: the API key (picks the tenant when the server maps keys to tenants).
        cache_salt: the runs' ``cache_salt``, if the chat model sends one.
        timeout_s: how long one end request may take.
    """

    run_inline = True  # parents are recorded before a child looks its root up
    raise_error = False

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str = "pbkv",
        cache_salt: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        super().__init__()
        self._base_url = base_url
        self._api_key = api_key
        self._cache_salt = cache_salt
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._root: dict[UUID, UUID] = {}  # run → its root run
        self._runs: dict[UUID, list[UUID]] = {}  # root → its runs
        self._used: dict[UUID, dict[str, None]] = {}  # root → workflow ids its calls used
        self.ended: list[str] = []  # workflow ids ended, in order

    def root_of(self, run_id: UUID | None) -> UUID | None:
        """Return the root run of ``run_id`` (``None``: a run this hook never saw)."""
        with self._lock:
            return self._root.get(run_id) if run_id is not None else None

    def used(self, root: UUID, workflow_id: str) -> None:
        """Record that a call under ``root`` used ``workflow_id`` (ended with the root)."""
        with self._lock:
            self._used.setdefault(root, {})[workflow_id] = None

    def _started(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            root = self._root.get(parent_run_id, parent_run_id) if parent_run_id else run_id
            self._root[run_id] = root
            self._runs.setdefault(root, []).append(run_id)

    def _finished(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        if parent_run_id is not None:
            return
        with self._lock:
            for run in self._runs.pop(run_id, ()):
                self._root.pop(run, None)
            workflows = list(self._used.pop(run_id, {}))
        for workflow_id in workflows:
            self._end(workflow_id)

    def _end(self, workflow_id: str) -> None:
        ended = end_workflow(
            self._base_url,
            workflow_id,
            api_key=self._api_key,
            cache_salt=self._cache_salt,
            timeout_s=self._timeout_s,
        )
        if ended:
            self.ended.append(workflow_id)

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_llm_start(
        self,
        serialized: Any,
        prompts: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_tool_start(
        self,
        serialized: Any,
        input_str: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._started(run_id, parent_run_id)

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self._finished(run_id, parent_run_id)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._finished(run_id, parent_run_id)


def _hook_and_run(run_manager: Any) -> tuple[WorkflowEnds | None, UUID | None]:
    """Return the :class:`WorkflowEnds` among a call's handlers and the run to look its
    root up by (the call's own run; without a run manager, the run calling it now)."""
    if run_manager is not None:
        handlers = [*run_manager.handlers, *run_manager.inheritable_handlers]
        run_id = run_manager.run_id
    else:
        manager = ensure_config().get("callbacks")
        handlers = list(getattr(manager, "handlers", None) or ())
        run_id = getattr(manager, "parent_run_id", None)
    hook = next((h for h in handlers if isinstance(h, WorkflowEnds)), None)
    return hook, run_id


class ChatPBKV(ChatOpenAI):
    """``ChatOpenAI`` that adds pbkv workflow hints from the LangGraph run metadata."""

    def _with_hints(self, run_manager: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        metadata = getattr(run_manager, "metadata", None)
        if run_manager is None:  # langchain_core's stream paths pass none
            metadata = ensure_config().get("metadata")
        hints = langgraph_hints(metadata or {})
        extra = {**(self.extra_body or {}), **(kwargs.get("extra_body") or {})}
        given = extra.get("pbkv") or {}
        hook, run_id = _hook_and_run(run_manager)
        root = hook.root_of(run_id) if hook is not None else None
        if root is not None:
            hints.setdefault("workflow_id", str(root))
            hook.used(root, str(given.get("workflow_id") or hints["workflow_id"]))
        if not hints:
            return kwargs
        extra["pbkv"] = {**hints, **given}
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
