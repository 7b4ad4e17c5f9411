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

Output and excerpt token ids are synthetic but real tokens (templated filing sentences,
tables and results), deterministic per ``(seed, workflow, step)``.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass

import numpy as np

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.examples import financebench_prompts as text
from pbkv.examples.apps import check_count, register_app
from pbkv.examples.tokenizer import encode
from pbkv.predictor.trace import END

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


class FinanceBenchApp:
    """A static five-agent sequential crew (see the module docstring)."""

    name = "financebench"
    agents = AGENTS
    entry_agents = ("researcher",)
    edges = (
        ("researcher", "analyst"),
        ("analyst", "calculator"),
        ("calculator", "writer"),
        ("writer", "reviewer"),
        ("reviewer", END),
    )

    def generate(self, n_workflows: int, seed: int) -> list[Workflow]:
        """Generate ``n_workflows`` workflows; workflow ``i`` depends only on ``(seed, i)``.

        Raises:
            ValueError: ``n_workflows`` or ``seed`` is negative.
        """
        check_count(n_workflows)
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return [self.generate_one(seed, i) for i in range(n_workflows)]

    def generate_one(self, seed: int, index: int) -> Workflow:
        """Generate workflow ``index`` of the workload drawn with ``seed``."""
        task_rng, output_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence([seed, index]).spawn(2)
        )
        task = sample_task(task_rng, f"{seed}-{index}")
        return Workflow(
            workflow_id=f"{self.name}-{seed}-{index}",
            app=self.name,
            task_id=task.task_id,
            task_text=task.text,
            steps=_build_steps(task, output_rng),
            task_features={
                "question_type": task.question_type,
                "complexity": task.complexity,
                "company": task.company,
                "fiscal_year": float(task.fiscal_year),
            },
        )


def _build_steps(task: FinanceTask, rng: np.random.Generator) -> tuple[Step, ...]:
    """Build the five steps; each context extends the previous one."""
    preamble, roles = _fixed_segments()
    history = encode(f"<|im_start|>user\n## Task\n{task.text}<|im_end|>\n") + _excerpt(task, rng)
    steps: list[Step] = []
    for agent in AGENTS:
        opener = _opener(agent)
        low, high = GAP_BEFORE_S.get(agent, (0.0, 0.0))
        output = _output(agent, task, rng)
        steps.append(
            Step(
                agent=agent,
                segments=(preamble, roles[agent], Segment("context", history + opener)),
                output_token_ids=output,
                gap_s=round(float(rng.uniform(low, high)), 3),
            )
        )
        history += opener + output
    return tuple(steps)


@functools.cache
def _fixed_segments() -> tuple[Segment, dict[str, Segment]]:
    preamble = Segment("preamble", encode(f"<|im_start|>system\n{text.render_preamble()}\n\n"))
    roles = {a: Segment("role", encode(f"{text.ROLE_PROMPTS[a]}<|im_end|>\n")) for a in AGENTS}
    return preamble, roles


@functools.cache
def _opener(agent: str) -> tuple[int, ...]:
    return encode(f"<|im_start|>assistant\n{agent.capitalize()}:\n")


@functools.cache
def _im_end() -> tuple[int, ...]:
    return encode("<|im_end|>\n")


def _excerpt(task: FinanceTask, rng: np.random.Generator) -> tuple[int, ...]:
    """Return the 10-K excerpt as a user message of realistic length."""
    n_tokens = int(rng.integers(EXCERPT_TOKENS[0], EXCERPT_TOKENS[1] + 1)) + int(
        EXCERPT_COMPLEXITY_TOKENS * task.complexity
    )
    header = f"<|im_start|>user\n## Form 10-K excerpt: {task.company}, fiscal {task.fiscal_year}\n"
    body = _filler(header, text.EXCERPT_LINES, n_tokens, task.fiscal_year, rng)
    return body + _im_end()


def _output(agent: str, task: FinanceTask, rng: np.random.Generator) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``."""
    low, high = OUTPUT_TOKENS[agent]
    n_tokens = int(rng.integers(low, high + 1)) + int(
        COMPLEXITY_BONUS_TOKENS[agent] * task.complexity
    )
    header = ""
    if agent == "reviewer":
        header = text.REVIEW_VERDICTS[int(rng.random() < 0.1 + 0.3 * task.complexity)]
    body = _filler(
        header, text.OUTPUT_BLOCKS[agent], n_tokens - len(_im_end()), task.fiscal_year, rng
    )
    return body + _im_end()


def _filler(
    header: str, lines: tuple[str, ...], n_tokens: int, year: int, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return ``header`` then random filled-in ``lines`` as exactly ``n_tokens`` ids.

    A header longer than ``n_tokens`` is returned whole. Template pieces and slot values
    are tokenized once and concatenated, so an output costs no tokenizer call; the ids
    are real and decode to the filled-in text.
    """
    draw = random.Random(int(rng.integers(2**63)))
    ids = list(_encode_cached(header))
    n_tokens = max(n_tokens, len(ids))
    while len(ids) < n_tokens:
        ids += _fill(draw.choice(lines), year, draw)
    return tuple(ids[:n_tokens])


def _fill(template: str, year: int, draw: random.Random) -> list[int]:
    """Return the ids of ``template`` with its slots filled in, newline included.

    A slot that appears twice in ``template`` gets the same value both times.
    """
    values: dict[str, str] = {}
    ids: list[int] = []
    for literal, slot in _template_pieces(template):
        ids += literal
        if slot:
            if slot not in values:
                values[slot] = draw.choice(_pools(year)[slot])
            ids += _encode_cached(values[slot])
    return ids


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


@functools.cache
def _template_pieces(template: str) -> tuple[tuple[tuple[int, ...], str | None], ...]:
    """Split ``template`` (plus a newline) into (literal ids, following slot name) pairs."""
    parsed = string.Formatter().parse(template + "\n")
    return tuple((_encode_cached(literal), slot) for literal, slot, _, _ in parsed)


@functools.cache
def _encode_cached(piece: str) -> tuple[int, ...]:
    return encode(piece)


register_app(FinanceBenchApp.name, FinanceBenchApp)
