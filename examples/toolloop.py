"""The ``toolloop`` app: a ReAct-style help-desk assistant that loops over two tools (§8).

One agent, the Assistant, works a ticket alone: START → Assistant, whose reply starts
with ``Action: search[...]`` or ``Action: read[...]`` (the tool runs, its result enters
the context as a ``tool`` message, and the turn goes back to the Assistant) or with
``Final Answer:`` (→ END). Each ticket has a hidden ``depth``, the number of tool
rounds it takes, and it is bimodal: with probability :data:`QUICK_PROBABILITY` a
``quick`` question (one tool round, so two Assistant calls), otherwise a ``deep``
investigation (rounds uniform in :data:`DEEP_ROUNDS`, so ``depth + 1`` calls). The
first round searches; each later one reads with probability :data:`READ_PROBABILITY`
(the ``route`` stream). The ticket's text opens with a noisy cue of its kind ("Quick
question:" or "Please investigate thoroughly:" and their variants), right with
probability :data:`CUE_ACCURACY`: a learnable signal, not a label. A tool's latency
(:data:`TOOL_GAP_S`) is drawn with the next Assistant call, whose ``gap_s`` it is.

It exists because of the workload where pbkv's eviction, when it ranked near-equal
predicted scores exactly instead of by workflow age, lost to LRU under the ``workflow``
scheduler: a tool loop of one agent whose task lengths are bimodal, so many contexts of
one agent with scores a few percent apart are resident at once, and a young workflow's
queued prefix evicted an older workflow's context between two of its tool calls, though
the older one came back first (``SCORE_BAND_RATIO`` in :mod:`pbkv.kvmanager.policies`,
measured on an unbundled loop of 2 or 40 calls; here deep tasks take 16 to 41).

On a real engine the route reads the reply's text: the first ``Final Answer:`` or
``Action:`` in it decides, an ``Action:`` naming ``read`` runs ``read`` and any other
``Action:`` runs ``search``; a reply with neither is taken as the final answer and
ends the workflow (as LangGraph's prebuilt ReAct agent ends on a message without a
tool call). A tool returns filler lines drawn as the sim's are (the ``tools``
stream). A loop that never answers ends with ``recursion_limit`` after
:data:`MAX_ASSISTANT_CALLS` Assistant calls and the tool the last one asked for.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared help-desk guidelines and tools;
- ``role``: the Assistant's role prompt + ``<|im_end|>``;
- ``context``: the ticket as a user message, then every earlier reply of the Assistant
  as an assistant message and every tool result as a ``tool`` message, and the opener
  of the Assistant's message.

So the prompt plus output of a step is a prefix of the next prompt. Output token ids
are synthetic but real tokens, deterministic per ``(seed, workflow)``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from pbkv.assets import decode
from pbkv.examples import toolloop_prompts as text
from pbkv.examples.apps import register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    system_prompt,
    task_opening,
    tool_message,
    transcript_prompt,
)
from pbkv.examples.filler import fill_lines, from_pools
from pbkv.examples.gaps import AppGaps
from pbkv.examples.sampling import draw_gap_s, draw_tokens, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.session import Reply, Simulated

AGENT = "assistant"
TOOLS = ("search", "read")
QUICK_PROBABILITY = 0.6
"""Probability that a ticket is a quick question (one tool round)."""
DEEP_ROUNDS = (15, 40)
"""Range of a deep investigation's tool rounds (drawn uniformly, both included)."""
CUE_ACCURACY = 0.8
"""Probability that the ticket's cue names its kind (else it names the other kind)."""
READ_PROBABILITY = 0.5
"""Probability that a round after the first reads a document instead of searching."""
MAX_ASSISTANT_CALLS = 48
"""Assistant calls after which a workflow that has not answered ends ``recursion_limit``."""
OUTPUT_TOKENS = (40, 200)
"""Range of an Assistant reply's tokens, ``<|im_end|>`` included."""
TOOL_TOKENS = (80, 300)
"""Range of a tool result's tokens, before its ``tool`` message's markers."""
TOOL_GAP_S = (0.5, 3.0)
"""Range of a tool's latency, drawn as the next Assistant call's ``gap_s``."""
STREAMS = ("task", "route", "output")
"""A workflow's draws: its ticket, its tool choices, its outputs."""
_DECISION = re.compile(r"Final Answer:|Action:\s*(\w*)")


def toolloop_task(seed: int, index: int) -> LiveTask:
    """Return ticket ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    rng = spawn_rngs(seed, index, 1)[0]
    kind = "quick" if rng.random() < QUICK_PROBABILITY else "deep"
    depth = 1 if kind == "quick" else int(rng.integers(DEEP_ROUNDS[0], DEEP_ROUNDS[1] + 1))
    cued = kind if rng.random() < CUE_ACCURACY else ("deep" if kind == "quick" else "quick")
    cue = str(rng.choice(text.CUES[cued]))
    detail = _fill(str(rng.choice(text.DETAILS)), rng)
    body = f"{cue} {rng.choice(text.TOPICS)}\n{detail}"
    features = {"kind": kind, "depth": float(depth)}
    return LiveTask(f"{seed}-{index}", body, features, (seed, index), STREAMS)


def tool_rounds(state: State) -> int:
    """Return the tool rounds the workflow has made so far."""
    return sum(state.visits[tool] for tool in TOOLS)


def next_action(state: State) -> str:
    """Draw the sim's next step: ``END`` after ``depth`` rounds, else the tool to call
    (``search`` first, then ``read`` with probability :data:`READ_PROBABILITY`, from
    the ``route`` stream)."""
    rounds = tool_rounds(state)
    if rounds >= state.task.features["depth"]:
        return END
    if rounds and state.rng("route").random() < READ_PROBABILITY:
        return "read"
    return "search"


def simulate_assistant(state: State, gaps: AppGaps | None = None) -> Simulated:
    """Return the Assistant's simulated reply: its first line (the action or
    ``Final Answer:``), the rest of its output, then the tool latency before it
    (:data:`TOOL_GAP_S`'s draw, or ``gaps``' cited one for the tool that ran)."""
    action = next_action(state)
    rng = state.rng("output")
    if action == END:
        header, lines = "Final Answer:\n", text.OUTPUT_LINES["final"]
    else:
        header, lines = f"Action: {action}[{_argument(action, rng)}]\n", text.OUTPUT_LINES["action"]
    n_tokens = draw_tokens(rng, OUTPUT_TOKENS)
    output = fill_lines(header, lines, n_tokens, rng, _VALUES, END_OF_TURN)
    bounds_s = TOOL_GAP_S if state.turns else (0.0, 0.0)
    bundled_s = draw_gap_s(rng, bounds_s)
    if gaps is None:
        return Simulated(token_ids=output, gap_s=bundled_s)
    tool = state.turns[-1].node if state.turns else None
    return Simulated(token_ids=output, gap_s=gaps.gap_s(tool, bundled_s, state))


def route_assistant(state: State, out: Reply | ToolResult) -> str:
    """Run the tool the reply's first ``Action:`` names (``read``, or else ``search``),
    or end on ``Final Answer:``, whichever comes first; a reply with neither ends."""
    match = _DECISION.search(out.text)
    if match is None or match.group(1) is None:
        return END
    return "read" if match.group(1).lower() == "read" else "search"


def simulate_tool(tool: str) -> Any:
    """Return the sim's result of ``tool`` as a ``tool`` message (the ``output`` stream)."""

    def simulate(state: State) -> ToolResult:
        ids = tool_message(_tool_body(tool, state.rng("output")))
        return ToolResult(tool, decode(ids), 0.0, ids)

    return simulate


def run_tool(tool: str) -> Any:
    """Return ``tool`` on a real engine: filler lines drawn as the sim's are (the
    ``tools`` stream); the driver renders them as a ``tool`` message."""

    async def run(state: State) -> str:
        return decode(_tool_body(tool, state.rng("tools")))

    return run


def _tool_body(tool: str, rng: np.random.Generator) -> tuple[int, ...]:
    """Return the ids of one ``tool`` result's lines: snippets or a document's text."""
    lines = text.SEARCH_RESULT_LINES if tool == "search" else text.READ_LINES
    return fill_lines("", lines, draw_tokens(rng, TOOL_TOKENS), rng, _VALUES)


def _argument(tool: str, rng: np.random.Generator) -> str:
    """Return a simulated action's argument: a query, or a document's identifier."""
    if tool == "search":
        return _fill(str(rng.choice(text.SEARCH_QUERIES)), rng)
    prefix = str(rng.choice(text.DOCUMENT_PREFIXES))
    return f"{prefix}-{rng.choice(text.VALUES['ticket' if prefix == 'T' else 'id'])}"


def _fill(template: str, rng: np.random.Generator) -> str:
    """Fill ``template``'s slots with values of :data:`toolloop_prompts.VALUES`."""
    return template.format_map(_SlotDraw(rng))


class _SlotDraw(dict[str, str]):
    """A template's slot values, each drawn from ``rng`` on first use."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self._rng = rng

    def __missing__(self, slot: str) -> str:
        value = self[slot] = str(self._rng.choice(text.VALUES[slot]))
        return value


_VALUES = from_pools(text.VALUES)


class ToolLoopApp(App):
    """ReAct-style tool loop of one assistant with bimodal task depths (see the module).

    Args:
        gap_model: ``bundled`` (:data:`TOOL_GAP_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("toolloop", preamble=text.render_preamble(), recursion_limit=128)
        gaps = AppGaps("toolloop", gap_model)
        system, opening = system_prompt(text), task_opening("Ticket")
        self.agent(
            AGENT,
            role=text.ROLE_PROMPTS[AGENT],
            prompt=transcript_prompt(system, AGENT, opening),
            max_new_tokens=OUTPUT_TOKENS[1] + 8,
            simulate=(
                simulate_assistant
                if gap_model == "bundled"
                else functools.partial(simulate_assistant, gaps=gaps)
            ),
            max_visits=MAX_ASSISTANT_CALLS,
        )
        for tool in TOOLS:
            self.tool(tool, run_tool(tool), simulate=simulate_tool(tool))
            self.edge(tool, AGENT)
        self.edge(START, AGENT).route(AGENT, route_assistant, [*TOOLS, END])
        self.tasks(toolloop_task)


register_app("toolloop", ToolLoopApp)
