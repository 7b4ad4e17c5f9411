"""The ``financebench`` app: a CrewAI sequential crew answering a 10-K question (§8).

Researcher → Analyst → Calculator → Writer → Reviewer → END, always: the call graph is
static, so a predictor can only be as good as KVFlow's step graph here (the paper's
FinanceBench comparison).

Each question has hidden features: ``question_type`` (``lookup``, ``ratio``, ``growth`` or
``adjusted``), ``complexity`` in [0, 1] (the type's base plus noise), ``company`` and
``fiscal_year``. They do not change the path; complexity lengthens the agents' outputs
and the filing excerpt. The question's wording is the cue ("operating margin",
"compound annual growth rate", "excluding restructuring charges").

Every prompt carries a long excerpt of the company's 10-K (:data:`EXCERPT_TOKENS` plus
up to 1000 for complex questions), as a second user message after the question: the
shared document of the workflow, repeated in every agent's context.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared crew guidelines and tools;
- ``role``: the agent's CrewAI role, goal, backstory and task + ``<|im_end|>``;
- ``context``: the question and the excerpt as user messages, then every earlier agent's
  result as an assistant message (``<|im_start|>assistant\\n{Agent}:\\n`` + its output,
  which ends with ``<|im_end|>\\n``), and finally the opener of the current agent's
  message.

A :class:`pbkv.live.App` graph of five agents and static edges. Simulated outputs and
the excerpt are synthetic but real tokens (templated filing sentences, tables and
results), drawn from the workflow's ``output`` stream (:data:`STREAMS`), so workflow
``i`` of ``seed`` depends only on ``(seed, i)``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pbkv.assets import encode
from pbkv.examples import financebench_prompts as text
from pbkv.examples.apps import register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    end_of_turn,
    render_message,
    system_prompt,
    transcript_prompt,
)
from pbkv.examples.filler import LineValues, fill_lines, from_pools
from pbkv.examples.gaps import AppGaps
from pbkv.examples.sampling import draw_gap_s, draw_tokens, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State
from pbkv.live.session import Simulated

AGENTS = ("researcher", "analyst", "calculator", "writer", "reviewer")
EXCERPT_TOKENS = (2000, 3000)
"""Tokens of the 10-K excerpt before the complexity bonus: (low, high)."""
EXCERPT_COMPLEXITY_TOKENS = 1000
OUTPUT_TOKENS = {  # (low, high) before the complexity bonus
    "researcher": (150, 300),
    "analyst": (120, 240),
    "calculator": (60, 160),
    "writer": (100, 200),
    "reviewer": (50, 140),
}
COMPLEXITY_BONUS_TOKENS = {
    "researcher": 100,
    "analyst": 80,
    "calculator": 160,
    "writer": 60,
    "reviewer": 40,
}
GAP_BEFORE_S = {  # tool/think time before each agent's invocation: (low, high)
    "analyst": (0.5, 2.0),  # the researcher's filing searches
    "calculator": (0.05, 0.3),  # crew hand-off
    "writer": (0.3, 1.5),  # the calculator's python run
    "reviewer": (0.05, 0.3),
}


@dataclass(frozen=True, slots=True)
class FinanceTask:
    """One question about a 10-K filing and its hidden features.

    Args:
        task_id: stable id for the same seed.
        text: the question as the agents see it (its wording is the cue of its type).
        question_type: a key of :data:`financebench_prompts.QUESTION_TYPES`.
        complexity: in [0, 1]; lengthens outputs and the excerpt.
        company: the filer's name.
        fiscal_year: the fiscal year the question is about.
    """

    task_id: str
    text: str
    question_type: str
    complexity: float
    company: str
    fiscal_year: int

    def features(self) -> dict[str, float | str]:
        """Return the hidden features, as ``Workflow.task_features``."""
        return {
            "question_type": self.question_type,
            "complexity": self.complexity,
            "company": self.company,
            "fiscal_year": float(self.fiscal_year),
        }


def sample_task(rng: np.random.Generator, task_id: str) -> FinanceTask:
    """Draw a question: its type and complexity, a company, a year, then the wording."""
    question_type = str(rng.choice(list(text.QUESTION_TYPES)))
    kind = text.QUESTION_TYPES[question_type]
    complexity = float(np.clip(kind.complexity + rng.normal(0.0, 0.1), 0.0, 1.0))
    company, ticker, sector = text.COMPANIES[int(rng.integers(len(text.COMPANIES)))]
    year = int(rng.choice(text.FISCAL_YEARS))
    question = str(rng.choice(kind.templates)).format(
        company=company, year=year, prior=year - 1, start=year - 3
    )
    task_text = (
        f"Company: {company} (NYSE: {ticker}), {sector}.\n"
        f"Filing: annual report on Form 10-K for fiscal {year}.\n"
        f"Question: {question}"
    )
    return FinanceTask(task_id, task_text, question_type, complexity, company, year)


STREAMS = ("task", "output")
"""A workflow's draws: its question, then its excerpt and outputs (children of ``(seed, i)``)."""


def finance_task(seed: int, index: int) -> LiveTask:
    """Return question ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    task = sample_task(spawn_rngs(seed, index, 1)[0], f"{seed}-{index}")
    return LiveTask(task.task_id, task.text, task.features(), (seed, index), STREAMS)


def opening(state: State) -> tuple[int, ...]:
    """Return the question and the 10-K excerpt as user messages (the excerpt is the
    workflow's first draw from its ``output`` stream)."""
    question = encode(render_message("user", f"## Task\n{state.task.text}"))
    return question + _excerpt(state.task.features, state.rng("output"))


def simulate_agent(agent: str, gaps: AppGaps | None = None) -> Any:
    """Return ``agent``'s simulated reply: an output, then the gap before it
    (:data:`GAP_BEFORE_S`'s draw, or ``gaps``' cited one: the searches, the python run)."""
    gaps = gaps or AppGaps("financebench")

    def simulate(state: State) -> Simulated:
        rng = state.rng("output")
        output = _output(agent, state.task.features, rng)
        bundled_s = draw_gap_s(rng, GAP_BEFORE_S.get(agent, (0.0, 0.0)))
        return Simulated(token_ids=output, gap_s=gaps.gap_s(agent, bundled_s, state))

    return simulate


def _excerpt(task: Mapping[str, Any], rng: np.random.Generator) -> tuple[int, ...]:
    """Return the 10-K excerpt as a user message of realistic length."""
    n_tokens = draw_tokens(rng, EXCERPT_TOKENS, EXCERPT_COMPLEXITY_TOKENS * task["complexity"])
    year = int(task["fiscal_year"])
    header = f"<|im_start|>user\n## Form 10-K excerpt: {task['company']}, fiscal {year}\n"
    body = fill_lines(header, text.EXCERPT_LINES, n_tokens, rng, _line_values(year))
    return body + end_of_turn()


def _output(agent: str, task: Mapping[str, Any], rng: np.random.Generator) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``."""
    bonus = COMPLEXITY_BONUS_TOKENS[agent] * task["complexity"]
    n_tokens = draw_tokens(rng, OUTPUT_TOKENS[agent], bonus)
    header = ""
    if agent == "reviewer":
        header = text.REVIEW_VERDICTS[int(rng.random() < 0.1 + 0.3 * task["complexity"])]
    return fill_lines(
        header,
        text.OUTPUT_BLOCKS[agent],
        n_tokens,
        rng,
        _line_values(int(task["fiscal_year"])),
        END_OF_TURN,
    )


def _line_values(year: int) -> LineValues:
    """Return how filing lines draw their slots: years from the filing's fiscal year."""
    return from_pools(_pools(year))


@functools.cache
def _pools(year: int) -> dict[str, tuple[str, ...]]:
    """Return the values each template slot draws from, for a filing of fiscal ``year``."""
    amounts = tuple(f"{n:,}" for n in range(800, 24000, 37))
    smalls = tuple(f"{n:,}" for n in range(12, 900, 7))
    return {
        "amount": amounts,
        "amount2": amounts,
        "small": smalls,
        "small2": smalls,
        "raw": tuple(a.replace(",", "") for a in amounts),
        "raw2": tuple(a.replace(",", "") for a in amounts),
        "points": tuple(f"{n / 10:.1f}" for n in range(1, 50)),
        "pct": tuple(f"{n / 10:.1f}" for n in range(5, 450, 3)),
        "item": text.LINE_ITEMS,
        "segment": text.SEGMENTS,
        "months": ("6", "12", "18", "24"),
        "year": (str(year),),
        "prior": (str(year - 1),),
        "k": ("1", "2", "3"),
    }


class FinanceBenchApp(App):
    """A static five-agent sequential crew (see the module docstring).

    Args:
        gap_model: ``bundled`` (:data:`GAP_BEFORE_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("financebench", preamble=text.render_preamble())
        gaps = AppGaps("financebench", gap_model)
        system = system_prompt(text)
        for agent in AGENTS:
            self.agent(
                agent,
                role=text.ROLE_PROMPTS[agent],
                prompt=transcript_prompt(system, agent, opening),
                max_new_tokens=OUTPUT_TOKENS[agent][1] + COMPLEXITY_BONUS_TOKENS[agent],
                simulate=simulate_agent(agent, gaps),
            )
        for source, target in zip((START, *AGENTS), (*AGENTS, END), strict=True):
            self.edge(source, target)
        self.tasks(finance_task)


register_app("financebench", FinanceBenchApp)
