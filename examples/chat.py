"""SmolLM2's chat format, tokenized piece by piece, for the bundled apps' prompts.

Every prompt starts with a system message split in two segments, a ``preamble`` that all
agents of an app share and a ``role`` per agent, then a ``context``: the messages so far
and the opener of the current agent's message. Pieces are tokenized once and
concatenated, so shared parts of different prompts have identical ids and a step's
prompt plus output is a prefix of every later prompt of the same agent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from pbkv.actors.workload import Segment
from pbkv.assets import encode
from pbkv.live.graph import PromptBuilder, State, TokenPrompt

END_OF_TURN = "<|im_end|>\n"


def render_message(role: str, content: str) -> str:
    """Return ``content`` as a whole ``role`` message, end-of-turn marker included."""
    return f"<|im_start|>{role}\n{content}{END_OF_TURN}"


@functools.cache
def encode_piece(piece: str) -> tuple[int, ...]:
    """Tokenize ``piece`` once per process (template pieces, slot values, markers)."""
    return encode(piece)


def end_of_turn() -> tuple[int, ...]:
    """Return the ids of ``<|im_end|>\\n``, which ends every message."""
    return encode_piece(END_OF_TURN)


def tool_message(body: tuple[int, ...], closing: str = "") -> tuple[int, ...]:
    """Return ``body`` (ids) as a ``tool`` message whose last line ends with ``closing``."""
    return encode_piece("<|im_start|>tool\n") + body + encode_piece(closing + END_OF_TURN)


def speaker_name(agent: str) -> str:
    """Return how ``agent`` signs its messages: ``query_rewriter`` → ``QueryRewriter``."""
    return agent.replace("_", " ").title().replace(" ", "")


@functools.cache
def assistant_opener(agent: str) -> tuple[int, ...]:
    """Return the ids that open ``agent``'s message: ``<|im_start|>assistant\\n{Name}:\\n``."""
    return encode(f"<|im_start|>assistant\n{speaker_name(agent)}:\n")


class SystemPrompt(NamedTuple):
    """The segments every prompt of an app starts with.

    Args:
        preamble: ``<|im_start|>system`` and the text all agents share.
        roles: per agent, its role prompt and the end of the system message.
    """

    preamble: Segment
    roles: Mapping[str, Segment]


class AppPrompts(Protocol):
    """An app's prompt text, as its ``*_prompts`` module holds it."""

    @property
    def ROLE_PROMPTS(self) -> Mapping[str, str]:
        """Return each agent's role prompt."""
        ...

    def render_preamble(self) -> str:
        """Return the text every agent of the app sees first."""
        ...


@functools.cache
def system_prompt(prompts: AppPrompts) -> SystemPrompt:
    """Return ``prompts``' system message as segments, tokenized once per process."""
    return tokenize_system_prompt(prompts.render_preamble(), prompts.ROLE_PROMPTS)


def tokenize_system_prompt(preamble: str, role_prompts: Mapping[str, str]) -> SystemPrompt:
    """Tokenize an app's system message as a shared preamble and one role per agent."""
    roles = {
        agent: Segment("role", encode(f"{prompt}{END_OF_TURN}"))
        for agent, prompt in role_prompts.items()
    }
    return SystemPrompt(Segment("preamble", encode(f"<|im_start|>system\n{preamble}\n\n")), roles)


def close_turn(output: tuple[int, ...]) -> tuple[int, ...]:
    """Return an agent's output closed as a message: ending with ``<|im_end|>\n``.

    The scripted outputs already end so; a real engine's stop at ``<|im_end|>`` gains the
    newline; an output cut off by its budget gains the whole marker.
    """
    close = end_of_turn()
    if output[-len(close) :] == close:
        return output
    marker = encode_piece("<|im_end|>")
    if output[-len(marker) :] == marker:
        return output + close[len(marker) :]
    return output + close


Opening = Callable[[State], tuple[int, ...]]
"""State → the ids of the messages before the first step (the task, as user messages)."""


def task_opening(heading: str) -> Opening:
    """Return an opening that shows the task as one user message under ``## {heading}``."""

    def opening(state: State) -> tuple[int, ...]:
        return encode(render_message("user", f"## {heading}\n{state.task.text}"))

    return opening


def context_ids(state: State, opening: Opening) -> tuple[int, ...]:
    """Return the workflow's context so far: the opening, then every turn in order.

    An agent's turn is its opener and its closed output (:func:`close_turn`); a tool's
    is its message's ids, none when it returned no text. The opening is computed once
    per workflow (it may draw).
    """
    ids = state.values.get("opening")
    if ids is None:
        ids = state.values["opening"] = opening(state)
    for turn in state.turns:
        if turn.kind == "tool":
            ids += turn.token_ids if turn.text else ()
        else:
            ids += assistant_opener(turn.node) + close_turn(turn.token_ids)
    return ids


def transcript_prompt(system: SystemPrompt, agent: str, opening: Opening) -> PromptBuilder:
    """Return ``agent``'s prompt builder: system segments, the context, ``agent``'s opener.

    So the prompt plus output of a step is a prefix of every later prompt of the same
    agent. The context tail is empty (these apps record none).
    """
    role = system.roles[agent]

    def prompt(state: State) -> TokenPrompt:
        context = context_ids(state, opening) + assistant_opener(agent)
        return TokenPrompt((system.preamble, role, Segment("context", context)))

    return prompt
