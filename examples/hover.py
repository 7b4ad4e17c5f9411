"""The ``hover`` app: LangChain-style multi-hop claim verification (§8, HoVer-like).

Decomposer → Retriever → Reader ⇒ {QueryRewriter → Retriever → Reader (one more hop),
Verifier}; Verifier ⇒ {END, Decomposer (re-plan)}. A :class:`pbkv.live.App` graph: the
Retriever's ``search`` is a tool whose passages enter the context; the Reader's router
takes one more hop until the round has made the searches the Decomposer planned (on a
real engine: its numbered sub-questions; on the sim: the hops the claim needs); the
Verifier's router reads its verdict (``NOT ENOUGH INFO`` re-plans), and the
Decomposer's visit cap ends a workflow past :data:`MAX_REPLANS` with ``recursion_limit``.

Each claim has hidden features: ``hops`` (2, 3 or 4) and ``difficulty`` in [0, 1]. The
first round of a workflow makes exactly ``hops`` searches; a re-plan round searches
again for the one hop the Verifier found missing. The probability that the Verifier
asks for a re-plan rises with difficulty and hop count and falls per re-plan; after
:data:`MAX_REPLANS` re-plans the workflow stops with ``recursion_limit``. The claim
text carries noisy cues: one relation phrase per hop ("the director of the novel that
... was adapted from"), distractor appositives that mention entities without adding a
hop, and hedged ("reportedly") or tricky ("not ... before") wording for harder claims.

The workload is prefill-heavy, like the paper's multi-hop workload: every search returns
:data:`PASSAGE_TOKENS` of retrieved passages as a ``tool`` message after the Retriever's
step, and they stay in the context of every later step; agents' own outputs are short.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared verification guidelines and tools;
- ``role``: the agent's role prompt + ``<|im_end|>``;
- ``context``: the claim as a user message, then every earlier step as an assistant
  message (``<|im_start|>assistant\\n{Agent}:\\n`` + its output, which ends with
  ``<|im_end|>\\n``), each search's passages as a ``tool`` message after its Retriever
  step, and finally the opener of the current agent's message.

So the prompt plus output of a step is a prefix of every later prompt of the same agent.
Output and passage token ids are synthetic but real tokens (templated lines about the
fictional entities of :mod:`pbkv.examples.hover_prompts`), deterministic per
``(seed, workflow, step)``.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pbkv.assets import decode
from pbkv.examples import hover_prompts as text
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
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.session import Reply, Simulated

_T = TypeVar("_T")

AGENTS = ("decomposer", "retriever", "reader", "query_rewriter", "verifier")
HOPS = (2, 3, 4)
HOP_WEIGHTS = (0.4, 0.35, 0.25)
"""How often claims need 2, 3 and 4 hops (HoVer has more 2-hop than 4-hop claims)."""
MAX_REPLANS = 2
"""Re-plans (Verifier → Decomposer rounds) before the workflow ends with ``recursion_limit``."""

OUTPUT_TOKENS = {  # (low, high) before the difficulty bonus
    "decomposer": (60, 150),
    "retriever": (30, 70),
    "reader": (60, 140),
    "query_rewriter": (30, 70),
    "verifier": (50, 120),
}
DIFFICULTY_BONUS_TOKENS = {"decomposer": 50, "reader": 60, "verifier": 80}
PASSAGE_TOKENS = (600, 1500)
"""Tokens of retrieved passages one search adds to the context: (low, high)."""
GAP_BEFORE_S = {  # tool/think time before each agent's invocation: (low, high)
    "decomposer": (0.02, 0.2),  # chain overhead
    "retriever": (0.02, 0.2),
    "reader": (0.3, 1.5),  # the search call that the Retriever issued
    "query_rewriter": (0.02, 0.2),
    "verifier": (0.02, 0.2),
}


@dataclass(frozen=True, slots=True)
class HoverTask:
    """One claim to verify and its hidden features.

    Args:
        task_id: stable id for the same seed.
        text: the claim and the instruction, as the agents see them.
        hops: searches the claim needs (2, 3 or 4); one relation phrase per hop.
        difficulty: in [0, 1]; drives the re-plan probability.
    """

    task_id: str
    text: str
    hops: int
    difficulty: float

    def features(self) -> dict[str, float | str]:
        """Return the hidden features, as ``Workflow.task_features``."""
        return {"hops": float(self.hops), "difficulty": self.difficulty}


def replan_probability(difficulty: float, hops: int, replan: int) -> float:
    """Return the probability that the Verifier asks for a re-plan after ``replan`` re-plans.

    Rises with difficulty and with each hop beyond two, falls by 0.2 per earlier re-plan;
    clipped to [0.02, 0.9].
    """
    p = 0.02 + 0.45 * difficulty + 0.06 * (hops - 2)
    return float(np.clip(p - 0.2 * replan, 0.02, 0.9))


def round_hops(hops: int, replan: int) -> int:
    """Return the searches of round ``replan``: all ``hops`` first, then the missing one."""
    return hops if replan == 0 else 1


def sample_task(rng: np.random.Generator, task_id: str) -> HoverTask:
    """Draw a claim: features first, then a text whose cues depend on them (with noise)."""
    hops = int(rng.choice(HOPS, p=HOP_WEIGHTS))
    difficulty = float(rng.random())
    claim = _claim(rng, hops, noisy_tier(rng, difficulty))
    instruction = str(rng.choice(text.INSTRUCTIONS))
    return HoverTask(task_id, f"Claim: {claim}\n{instruction}", hops, difficulty)


def _claim(rng: np.random.Generator, hops: int, tier: int) -> str:
    """Return a claim with ``hops - 1`` relation phrases and one final predicate."""
    kind = str(rng.choice(sorted({r.source for r in text.RELATIONS})))
    phrase = str(rng.choice(text.ENTITIES[kind]))
    if rng.random() < 0.3:  # a distractor: one more entity mentioned, no more hops
        phrase += _fill_text(str(rng.choice(text.DISTRACTORS[kind])), rng)
    for _ in range(hops - 1):
        relation = _choose(rng, [r for r in text.RELATIONS if r.source == kind])
        phrase, kind = relation.phrase.format(x=phrase), relation.target
    predicate = _choose(rng, [p for p in text.PREDICATES if p.source == kind])
    template = (predicate.plain, predicate.hedged, predicate.tricky)[tier]
    value = _fill_text(f"{{{predicate.value_kind}}}", rng)
    claim = template.format(x=phrase, value=value)
    return claim[0].upper() + claim[1:]


def _choose(rng: np.random.Generator, options: list[_T]) -> _T:
    return options[int(rng.integers(len(options)))]


def _fill_text(template: str, rng: np.random.Generator) -> str:
    """Fill ``template``'s slots (entity kinds or ``year``) with random values."""
    names = {slot for _, slot, _, _ in string.Formatter().parse(template) if slot}
    return template.format(**{slot: _choose(rng, list(_pools()[slot])) for slot in names})


STREAMS = ("task", "route", "output")
"""A workflow's draws: its claim, its verdicts, its outputs (children of ``(seed, i)``)."""
SIMULATED_HOPS = "simulated_hops"
"""``State.values`` key: the searches the sim's Decomposer plans for this round."""


def hover_task(seed: int, index: int) -> LiveTask:
    """Return claim ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    task = sample_task(spawn_rngs(seed, index, 1)[0], f"{seed}-{index}")
    return LiveTask(task.task_id, task.text, task.features(), (seed, index), STREAMS)


def simulate_agent(agent: str, gaps: AppGaps | None = None) -> Any:
    """Return ``agent``'s simulated reply: an output, then the gap before it.

    The Decomposer also plans its round's searches; the Verifier first draws whether it
    re-plans (the ``route`` stream) and says so in its verdict. The gap is
    :data:`GAP_BEFORE_S`'s draw, or ``gaps``' cited one (the Reader's: the search).
    """
    gaps = gaps or AppGaps("hover")

    def simulate(state: State) -> Simulated:
        features = state.task.features
        replans = False
        if agent == "decomposer":
            state.values[SIMULATED_HOPS] = round_hops(
                int(features["hops"]), state.visits["decomposer"]
            )
        elif agent == "verifier":
            p = replan_probability(
                features["difficulty"], int(features["hops"]), state.visits["decomposer"] - 1
            )
            replans = bool(state.rng("route").random() < p)
        rng = state.rng("output")
        output = _output(agent, features, replans, rng)
        bounds_s = GAP_BEFORE_S[agent] if state.turns else (0.0, 0.0)
        key = agent if state.turns else None
        return Simulated(token_ids=output, gap_s=gaps.gap_s(key, draw_gap_s(rng, bounds_s), state))

    return simulate


def planned_hops(text_: str) -> int:
    """Return the searches a Decomposer's reply plans: its numbered sub-questions (1–4)."""
    questions = re.findall(r"^\s*\d+[.)]\s", text_, re.MULTILINE)
    return int(np.clip(len(questions), 1, max(HOPS)))


def route_plan(state: State, out: Reply | ToolResult) -> str:
    """Record the round's planned searches, then search."""
    simulated = state.values.pop(SIMULATED_HOPS, None)
    state.values["round_hops"] = simulated if simulated is not None else planned_hops(out.text)
    return "retriever"


def route_reader(state: State, out: Reply | ToolResult) -> str:
    """Take one more hop until this round has made its planned searches."""
    searches = 0
    for turn in reversed(state.turns):
        if turn.node == "decomposer":
            break
        searches += turn.node == "retriever"
    return "query_rewriter" if searches < state.values["round_hops"] else "verifier"


def route_verifier(state: State, out: Reply | ToolResult) -> str:
    """Re-plan when the Verifier finds information missing; end otherwise."""
    return "decomposer" if "NOT ENOUGH INFO" in out.text.split("\n", 1)[0] else END


def simulate_search(state: State) -> ToolResult:
    """Return one search's passages as a ``tool`` message (the ``output`` stream)."""
    ids = _passages(state.rng("output"))
    return ToolResult("search", decode(ids), 0.0, ids)


async def search(state: State) -> str:
    """Return one search's passages on a real engine (the fictional corpus's lines)."""
    rng = state.rng("search")
    n_tokens = draw_tokens(rng, PASSAGE_TOKENS)
    return decode(fill_lines("", text.PASSAGE_LINES, n_tokens, rng, from_pools(_pools())))


def _output(
    agent: str, task: Mapping[str, Any], replans: bool, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``.

    A Verifier's output opens with its verdict: a re-plan request when ``replans``.
    """
    bonus = DIFFICULTY_BONUS_TOKENS.get(agent, 0) * task["difficulty"]
    n_tokens = draw_tokens(rng, OUTPUT_TOKENS[agent], bonus)
    header = ""
    if agent == "verifier":
        verdict = "replan" if replans else str(rng.choice(["supported", "refuted"]))
        header = text.VERDICTS[verdict]
    return fill_lines(
        header, text.OUTPUT_BLOCKS[agent], n_tokens, rng, from_pools(_pools()), END_OF_TURN
    )


def _passages(rng: np.random.Generator) -> tuple[int, ...]:
    """Return a ``tool`` message holding one search's retrieved passages."""
    n_tokens = draw_tokens(rng, PASSAGE_TOKENS)
    return tool_message(fill_lines("", text.PASSAGE_LINES, n_tokens, rng, from_pools(_pools())))


@functools.cache
def _pools() -> dict[str, tuple[str, ...]]:
    """Return the values each template slot draws from."""
    years = tuple(str(y) for y in range(1890, 2016))
    pools = dict(text.ENTITIES)
    pools.update(
        person2=text.ENTITIES["person"],
        city2=text.ENTITIES["city"],
        year=years,
        year2=years,
        n=tuple(str(n) for n in range(2, 90)),
        k=("1", "2", "3", "4"),
        relation=text.RELATION_WORDS,
        kind=text.KINDS,
    )
    return pools


class HoverApp(App):
    """Multi-hop claim verification with a re-plan loop (see the module docstring).

    Args:
        gap_model: ``bundled`` (:data:`GAP_BEFORE_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("hover", preamble=text.render_preamble(), recursion_limit=64)
        gaps = AppGaps("hover", gap_model)
        system, opening = system_prompt(text), task_opening("Task")
        for agent in AGENTS:
            high = OUTPUT_TOKENS[agent][1]
            self.agent(
                agent,
                role=text.ROLE_PROMPTS[agent],
                prompt=transcript_prompt(system, agent, opening),
                max_new_tokens=high + DIFFICULTY_BONUS_TOKENS.get(agent, 0),
                simulate=simulate_agent(agent, gaps),
                max_visits=MAX_REPLANS + 1 if agent == "decomposer" else None,
            )
        self.tool("search", search, simulate=simulate_search)
        self.edge(START, "decomposer").route("decomposer", route_plan, ["retriever"])
        self.edge("retriever", "search").edge("search", "reader")
        self.route("reader", route_reader, ["query_rewriter", "verifier"])
        self.edge("query_rewriter", "retriever")
        self.route("verifier", route_verifier, ["decomposer", END])
        self.tasks(hover_task)


register_app("hover", HoverApp)
