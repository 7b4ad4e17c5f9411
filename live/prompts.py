"""Agent prompts of a graph app: system segments, the default transcript, builders' messages.

Every agent's prompt is the app's shared ``preamble`` segment, the agent's ``role``
segment, and a ``context`` segment ending in the agent's signed opener. The default
context is the transcript of the workflow so far, built so that each prompt extends the
previous prompt and output of the same agent (its cache is reused); a prompt builder
may give its own messages or a whole :class:`~pbkv.live.graph.TokenPrompt` instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from pbkv.actors.workload import Segment
from pbkv.live.chat import ChatFormat, message_parts
from pbkv.live.errors import NodeFailed
from pbkv.live.graph import AgentNode, App, State, TokenPrompt


def speaker_name(agent: str) -> str:
    """Return how ``agent`` signs its messages: ``query_rewriter`` → ``QueryRewriter``."""
    return agent.replace("_", " ").title().replace(" ", "")


@functools.lru_cache(maxsize=4096)
def encoded(chat: ChatFormat, text: str) -> tuple[int, ...]:
    """Return ``chat.encode(text)``, cached (system segments and openers recur)."""
    return chat.encode(text)


def system_segments(chat: ChatFormat, app: App, agent: AgentNode) -> tuple[Segment, Segment]:
    """Return the shared ``preamble`` and ``agent``'s ``role`` segment (tokenized once)."""
    preamble = encoded(chat, f"<|im_start|>system\n{app.preamble}\n\n")
    role = encoded(chat, f"{agent.role}{chat.stop_text}\n")
    return Segment("preamble", preamble), Segment("role", role)


def transcript(chat: ChatFormat, state: State) -> tuple[int, ...]:
    """Return the default context: the task as a user message, then every turn.

    An agent's turn is its signed opener plus its exact output ids (closed with the
    end-of-turn marker when it was cut off), so each prompt extends the last one's
    prompt + output and the cache is reused; a tool's turn is its tool message.
    """
    ids = encoded(chat, chat.render("user", state.task.text))
    stop = encoded(chat, chat.stop_text)
    for turn in state.turns:
        if turn.kind == "tool":
            ids += turn.token_ids
            continue
        closed = turn.token_ids[-len(stop) :] == stop
        ids += encoded(chat, chat.opener(speaker_name(turn.node))) + turn.token_ids
        ids += encoded(chat, "\n") if closed else stop + encoded(chat, "\n")
    return ids


def agent_prompt(chat: ChatFormat, app: App, agent: AgentNode, state: State) -> tuple[Segment, ...]:
    """Return the segments of ``agent``'s next call: system, context, signed opener."""
    return agent_call_prompt(chat, app, agent, state).segments


def agent_call_prompt(chat: ChatFormat, app: App, agent: AgentNode, state: State) -> TokenPrompt:
    """Return ``agent``'s next prompt and its context tail.

    A builder's :class:`~pbkv.live.graph.TokenPrompt` is taken as it is; otherwise the
    segments are system, context (the builder's messages or the default transcript)
    and signed opener, and the tail is the newest turn's text (the task's at first).
    The builder's messages are checked as :meth:`WorkflowSession.call` checks its own
    (:func:`~pbkv.live.chat.message_parts`).

    Raises:
        NodeFailed: the prompt builder raised (chained).
        TypeError / ValueError: it returned neither messages, a ``TokenPrompt`` nor
            ``None``, or a bad message (the agent and the message's index named).
    """
    built = None
    if agent.prompt is not None:
        try:
            built = agent.prompt(state)
        except Exception as exc:
            raise NodeFailed(agent.name, "prompt builder", exc) from exc
    if isinstance(built, TokenPrompt):
        return built
    if built is None:
        context = transcript(chat, state)
    else:
        context = tuple(
            t for text in _built_messages(chat, agent, built) for t in encoded(chat, text)
        )
    opener = encoded(chat, chat.opener(speaker_name(agent.name)))
    segments = (*system_segments(chat, app, agent), Segment("context", context + opener))
    last = state.last
    return TokenPrompt(segments, last.text if last is not None else state.task.text)


def _built_messages(chat: ChatFormat, agent: AgentNode, built: Any) -> list[str]:
    """Return a prompt builder's messages rendered one by one, each checked."""
    if isinstance(built, (str, bytes, Mapping)) or not isinstance(built, Sequence):
        raise TypeError(
            f"prompt builder of agent {agent.name!r} returned {type(built).__name__}; expected "
            "a list of {'role': ..., 'content': ...} messages, a TokenPrompt or None"
        )
    rendered = []
    for i, message in enumerate(built):
        try:
            role, text = message_parts(i, message)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"prompt builder of agent {agent.name!r}: {exc}") from exc
        rendered.append(chat.render(role, text))
    return rendered
