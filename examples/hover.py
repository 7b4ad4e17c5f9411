"""The ``hover`` app: LangChain-style multi-hop claim verification (§8, HoVer-like).

Decomposer → Retriever → Reader ⇒ {QueryRewriter → Retriever → Reader (one more hop),
Verifier}; Verifier ⇒ {END, Decomposer (re-plan)}.

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
import string
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from pbkv.actors.workload import Step
from pbkv.examples import hover_prompts as text
from pbkv.examples.apps import RoutedApp, register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    Transcript,
    render_message,
    system_prompt,
    tool_message,
)
from pbkv.examples.filler import fill_lines, from_pools
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier
from pbkv.examples.tokenizer import encode
from pbkv.predictor.trace import END

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


def sample_path(task: HoverTask, rng: np.random.Generator) -> tuple[tuple[str, ...], str]:
    """Route one workflow: return its agent path and end reason."""
    path: list[str] = []
    for replan in range(MAX_REPLANS + 1):
        path.append("decomposer")
        for hop in range(round_hops(task.hops, replan)):
            path += ["query_rewriter", "retriever", "reader"] if hop else ["retriever", "reader"]
        path.append("verifier")
        if rng.random() >= replan_probability(task.difficulty, task.hops, replan):
            return tuple(path), "end"
    return tuple(path), "recursion_limit"


def _build_steps(
    task: HoverTask, path: tuple[str, ...], end_reason: str, rng: np.random.Generator
) -> tuple[Step, ...]:
    """Build the steps of ``path``; each context extends the previous one."""
    chat = Transcript(system_prompt(text), encode(render_message("user", f"## Task\n{task.text}")))
    steps: list[Step] = []
    for i, agent in enumerate(path):
        gap_bounds_s = GAP_BEFORE_S[agent] if steps else (0.0, 0.0)
        # every Verifier of a capped workflow asked for a re-plan
        replans = end_reason == "recursion_limit" or path[i + 1 : i + 2] == ("decomposer",)
        output = _output(agent, task, replans, rng)
        steps.append(chat.take_turn(agent, output, draw_gap_s(rng, gap_bounds_s)))
        if agent == "retriever":
            chat.append(_passages(rng))
    return tuple(steps)


def _output(
    agent: str, task: HoverTask, replans: bool, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``.

    A Verifier's output opens with its verdict: a re-plan request when ``replans``.
    """
    bonus = DIFFICULTY_BONUS_TOKENS.get(agent, 0) * task.difficulty
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


class HoverApp(RoutedApp[HoverTask]):
    """Multi-hop claim verification with a re-plan loop (see the module docstring)."""

    name = "hover"
    agents = AGENTS
    entry_agents = ("decomposer",)
    edges = (
        ("decomposer", "retriever"),
        ("retriever", "reader"),
        ("reader", "query_rewriter"),
        ("reader", "verifier"),
        ("query_rewriter", "retriever"),
        ("verifier", END),
        ("verifier", "decomposer"),
    )

    sample_task = staticmethod(sample_task)
    sample_path = staticmethod(sample_path)
    build_steps = staticmethod(_build_steps)


register_app(HoverApp.name, HoverApp)
