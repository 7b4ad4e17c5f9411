"""The ``groupchat`` app: an AutoGen-style selector group chat that keeps one speaker (§8).

Every round is a Selector call, then the member it names: Selector ⇒ {Researcher, Writer,
Critic, Engineer, END} and each member hands back to the Selector. Such chats often
circle around one member (the Engineer iterating on a computation, the Writer on a
draft): each task has a hidden ``favourite`` member whom the Selector names with
probability ``stickiness`` (in [0.6, 0.95]), and any other member otherwise. After
:data:`MIN_ROUNDS` rounds the Selector ends the chat (``TERMINATE``) with probability
``1 / expected_rounds`` per round; at :data:`MAX_ROUNDS` rounds the chat stops with
``recursion_limit``. The request's text carries a noisy cue of the favourite ("needs
sources", "needs a computation"...): a learnable signal, not a label.

This is the workload where a forecast horizon hurts most: the members other than the
favourite speak rarely, so their next call often lies beyond any short horizon, and
their caches must still rank as a recency policy would rank them.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared team guidelines and tools;
- ``role``: the agent's role prompt + ``<|im_end|>``;
- ``context``: the request as a user message, then every earlier message of the chat
  (the Selector's included) as an assistant message, and the opener of the current
  agent's message.

So the prompt plus output of a step is a prefix of every later prompt of the same agent.
Output token ids are synthetic but real tokens, deterministic per ``(seed, workflow)``.
"""

from __future__ import annotations

import re
from typing import Any

from pbkv.examples import groupchat_prompts as text
from pbkv.examples.apps import register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    speaker_name,
    system_prompt,
    task_opening,
    transcript_prompt,
)
from pbkv.examples.filler import fill_lines, from_pools
from pbkv.examples.gaps import AppGaps
from pbkv.examples.sampling import draw_gap_s, draw_tokens, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.session import Reply, Simulated

MEMBERS = ("researcher", "writer", "critic", "engineer")
AGENTS = ("selector", *MEMBERS)
MIN_ROUNDS = 3
"""Rounds before the Selector may end the chat."""
MAX_ROUNDS = 14
"""Rounds (member turns) after which the chat stops with ``recursion_limit``."""
EXPECTED_ROUNDS = (4.0, 10.0)
"""Range of a task's expected rounds beyond :data:`MIN_ROUNDS` (drawn uniformly)."""
STICKINESS = (0.6, 0.95)
"""Range of the probability that the Selector names the task's favourite member."""
OUTPUT_TOKENS = {  # (low, high)
    "selector": (6, 16),
    "researcher": (120, 320),
    "writer": (150, 380),
    "critic": (80, 220),
    "engineer": (100, 300),
}
GAP_BEFORE_S = {  # think/tool time before each agent's invocation: (low, high)
    "selector": (0.02, 0.1),  # group-chat overhead
    "researcher": (1.0, 4.0),  # document search
    "writer": (0.05, 0.3),
    "critic": (0.05, 0.3),
    "engineer": (0.5, 3.0),  # running the program
}
CUES = {
    "researcher": ("Please cite sources for every figure.", "We need the primary documents."),
    "writer": ("The customer wants a polished reply.", "Tone and clarity matter most here."),
    "critic": ("Double-check everything before it goes out.", "Past answers had errors."),
    "engineer": ("This needs a computation.", "Please run the numbers."),
}
CUE_ACCURACY = 0.7
"""Probability that the request's cue names its favourite (else a random member's)."""
STREAMS = ("task", "route", "output")
"""A workflow's draws: its request, the Selector's picks, its outputs."""
_AGENT_BY_SPEAKER = {speaker_name(a): a for a in MEMBERS}


def groupchat_task(seed: int, index: int) -> LiveTask:
    """Return request ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    rng = spawn_rngs(seed, index, 1)[0]
    favourite = str(rng.choice(MEMBERS))
    stickiness = float(rng.uniform(*STICKINESS))
    expected_rounds = float(rng.uniform(*EXPECTED_ROUNDS))
    cued = favourite if rng.random() < CUE_ACCURACY else str(rng.choice(MEMBERS))
    topic = str(rng.choice(text.TOPICS))
    body = f"Please work out {topic}.\n{rng.choice(CUES[cued])}"
    features = {
        "favourite": favourite,
        "stickiness": stickiness,
        "expected_rounds": expected_rounds,
    }
    return LiveTask(f"{seed}-{index}", body, features, (seed, index), STREAMS)


def next_speaker(state: State) -> str:
    """Draw the Selector's pick on the sim (``route`` stream): ``END`` (after
    :data:`MIN_ROUNDS` rounds, probability ``1 / expected_rounds``), the favourite
    (probability ``stickiness``) or another member."""
    f = state.task.features
    rng = state.rng("route")
    rounds = sum(state.visits[m] for m in MEMBERS)
    if rounds >= MIN_ROUNDS and rng.random() < 1.0 / f["expected_rounds"]:
        return END
    if rng.random() < f["stickiness"]:
        return str(f["favourite"])
    return str(rng.choice([m for m in MEMBERS if m != f["favourite"]]))


def simulate_agent(agent: str, gaps: AppGaps | None = None) -> Any:
    """Return ``agent``'s simulated reply (the Selector's starts with its pick), then the
    gap before it (:data:`GAP_BEFORE_S`'s draw, or ``gaps``' cited one)."""
    gaps = gaps or AppGaps("groupchat")

    def simulate(state: State) -> Simulated:
        header = ""
        if agent == "selector":
            pick = next_speaker(state)
            header = "TERMINATE\n" if pick == END else f"Next speaker: {speaker_name(pick)}\n"
        rng = state.rng("output")
        n_tokens = draw_tokens(rng, OUTPUT_TOKENS[agent])
        output = fill_lines(header, text.OUTPUT_LINES[agent], n_tokens, rng, _VALUES, END_OF_TURN)
        bounds_s = GAP_BEFORE_S[agent] if state.turns else (0.0, 0.0)
        key = agent if state.turns else None
        return Simulated(token_ids=output, gap_s=gaps.gap_s(key, draw_gap_s(rng, bounds_s), state))

    return simulate


def route_selector(state: State, out: Reply | ToolResult) -> str:
    """End on ``TERMINATE``; else hand the turn to the member ``Next speaker:`` names (a
    reply naming nobody goes to the member who spoke last, the Researcher at first)."""
    if "TERMINATE" in out.text.split("\n", 1)[0]:
        return END
    match = re.search(r"Next speaker:\s*(\w+)", out.text)
    member = _AGENT_BY_SPEAKER.get(match.group(1)) if match else None
    if member is not None:
        return member
    last = next((t.node for t in reversed(state.turns) if t.node in MEMBERS), None)
    return last or "researcher"


_VALUES = from_pools(
    {
        "thing": text.THINGS,
        "n": tuple(str(n) for n in range(2, 100)),
        "m": tuple(str(n) for n in range(100, 5000, 7)),
        "k": tuple(str(n) for n in range(10)),
        "year": tuple(str(y) for y in range(2015, 2027)),
    }
)


class GroupChatApp(App):
    """Selector group chat that keeps naming one member (see the module docstring).

    Args:
        gap_model: ``bundled`` (:data:`GAP_BEFORE_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("groupchat", preamble=text.render_preamble(), recursion_limit=128)
        gaps = AppGaps("groupchat", gap_model)
        system, opening = system_prompt(text), task_opening("Request")
        for agent in AGENTS:
            self.agent(
                agent,
                role=text.ROLE_PROMPTS[agent],
                prompt=transcript_prompt(system, agent, opening),
                max_new_tokens=OUTPUT_TOKENS[agent][1] + 8,
                simulate=simulate_agent(agent, gaps),
                max_visits=MAX_ROUNDS if agent == "selector" else None,
            )
        self.edge(START, "selector").route("selector", route_selector, [*MEMBERS, END])
        for member in MEMBERS:
            self.edge(member, "selector")
        self.tasks(groupchat_task)


register_app("groupchat", GroupChatApp)
