"""Helpers that let agent frameworks pass pbkv's workflow hints with no other change.

:mod:`pbkv.integrations.langchain` (needs ``langchain-openai``, in the ``serve`` extra):
:func:`~pbkv.integrations.langchain.chat_model` returns a ``ChatOpenAI`` that fills the
workflow id from LangGraph's ``thread_id`` (or the root run) and the agent from the node
name, and :class:`~pbkv.integrations.langchain.WorkflowEnds` ends a run's workflow when
the run ends. :mod:`pbkv.integrations.openai_agents` (needs ``openai-agents``) runs an
Agents SDK agent as one workflow, each agent named, ended when the run ends. The plain
functions here need no framework; notes for the other frameworks are in
``docs/serve.md``.
"""

from pbkv.integrations.hints import end_workflow, hint_body, hint_headers, langgraph_hints

__all__ = ["end_workflow", "hint_body", "hint_headers", "langgraph_hints"]
