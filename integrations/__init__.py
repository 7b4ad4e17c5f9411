"""Helpers that let agent frameworks pass pbkv's workflow hints with no other change.

:mod:`pbkv.integrations.langchain` (needs ``langchain-openai``, in the ``serve`` extra):
:func:`~pbkv.integrations.langchain.chat_model` returns a ``ChatOpenAI`` that fills the
workflow id from LangGraph's ``thread_id`` and the agent from the node name. The plain
functions here need no framework; notes for the other frameworks are in
``docs/serve.md``.
"""

from pbkv.integrations.hints import hint_body, hint_headers, langgraph_hints

__all__ = ["hint_body", "hint_headers", "langgraph_hints"]
