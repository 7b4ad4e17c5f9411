"""SmolLM2's chat format, tokenized piece by piece, for the bundled apps' prompts.

Every prompt starts with a system message split in two segments, a ``preamble`` that all
agents of an app share and a ``role`` per agent, then a ``context``: the messages so far
and the opener of the current agent's message. Pieces are tokenized once and
concatenated, so shared parts of different prompts have identical ids and a step's
prompt plus output is a prefix of every later prompt of the same agent.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from pbkv.actors.workload import Segment, Step
from pbkv.assets import encode

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


class Transcript:
    """The context of one workflow's chat, which every step extends.

    Args:
        system: the preamble and role segments each step's prompt starts with.
        opening: ids of the messages before the first step (the task, as user messages).
    """

    def __init__(self, system: SystemPrompt, opening: tuple[int, ...]) -> None:
        self._system = system
        self.history = opening

    def take_turn(self, agent: str, output: tuple[int, ...], gap_s: float) -> Step:
        """Return ``agent``'s step on the context so far, then add its message to the context.

        Mutates: the context grows by ``agent``'s opener and ``output``.
        """
        opener = assistant_opener(agent)
        step = Step(
            agent=agent,
            segments=(
                self._system.preamble,
                self._system.roles[agent],
                Segment("context", self.history + opener),
            ),
            output_token_ids=output,
            gap_s=gap_s,
        )
        self.history += opener + output
        return step

    def append(self, message: tuple[int, ...]) -> None:
        """Add ``message`` (ids, such as a tool result) to the context.

        Mutates: the context grows by ``message``.
        """
        self.history += message
