"""The ``codegen`` app (paper Fig. 1): Planner → Coder → Tester ⇒ {Analyzer → Coder → Tester, END}.

Each task has hidden features (``difficulty`` in [0, 1], ``language``, ``domain``). They set
the probability that a test run fails, which falls a little with each retry, and they
leave noisy cues in the task text ("simple", "edge cases", "tricky concurrency"): a
learnable signal, not a label. After :data:`MAX_RETRIES` failed retries the workflow
stops with ``recursion_limit``.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared guidelines and tool documentation;
- ``role``: the agent's role prompt + ``<|im_end|>``;
- ``context``: the task as a user message, then every earlier step as an assistant
  message (``<|im_start|>assistant\\n{Agent}:\\n`` + its output, which ends with
  ``<|im_end|>\\n``), a failed test run as a ``tool`` message after its Tester step, and
  finally the opener of the current agent's message.

So the prompt plus output of a step is a prefix of every later prompt of the same agent.
Output token ids are synthetic but real tokens (templated plan, code, test and analysis
lines), deterministic per ``(seed, workflow, step)``.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass

import numpy as np

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.examples import codegen_prompts as text
from pbkv.examples.apps import check_count, register_app
from pbkv.examples.tokenizer import encode
from pbkv.predictor.trace import END

AGENTS = ("planner", "coder", "tester", "analyzer")
MAX_RETRIES = 4
"""Retries (Analyzer → Coder → Tester rounds) before the workflow ends with ``recursion_limit``."""

LANGUAGE_OFFSET = {"Python": -0.04, "TypeScript": 0.0, "Go": 0.0, "Java": 0.02, "Rust": 0.05}
OUTPUT_TOKENS = {  # (low, high) before the difficulty bonus
    "planner": (200, 320),
    "coder": (400, 650),
    "tester": (100, 220),
    "analyzer": (150, 300),
}
DIFFICULTY_BONUS_TOKENS = {"planner": 80, "coder": 250, "tester": 80, "analyzer": 0}
GAP_BEFORE_S = {  # tool/think time before each agent's invocation: (low, high)
    "coder": (0.05, 0.3),  # framework overhead, reading files
    "tester": (0.3, 1.5),  # writing files, compiling
    "analyzer": (1.0, 5.0),  # the test run that failed
}
TEST_LOG_TOKENS = (60, 200)


@dataclass(frozen=True, slots=True)
class CodegenTask:
    """One programming task and its hidden features.

    Args:
        task_id: stable id for the same seed.
        text: the task as the agents see it (carries noisy cues of the features).
        difficulty: in [0, 1]; drives the test-failure probability.
        language: the target language.
        domain: a key of :data:`codegen_prompts.DOMAINS`.
    """

    task_id: str
    text: str
    difficulty: float
    language: str
    domain: str


def failure_probability(difficulty: float, language: str, domain: str, retry: int) -> float:
    """Return the probability that the test run after ``retry`` earlier retries fails.

    Rises with difficulty, depends a little on language and domain, falls by 0.07 per
    retry; clipped to [0.02, 0.95].
    """
    p = 0.08 + 0.75 * difficulty + text.DOMAINS[domain][0] + LANGUAGE_OFFSET[language]
    return float(np.clip(p - 0.07 * retry, 0.02, 0.95))


def sample_task(rng: np.random.Generator, task_id: str) -> CodegenTask:
    """Draw a task: features first, then a text whose cues depend on them (with noise)."""
    difficulty = float(rng.random())
    language = str(rng.choice(text.LANGUAGES))
    domain = str(rng.choice(list(text.DOMAINS)))
    summary = str(rng.choice(text.DOMAINS[domain][1]))
    lines = [_cue(rng, difficulty) for _ in range(1 + int(difficulty > 0.5))]
    if rng.random() < 0.2:  # a misleading cue from any tier
        lines.append(str(rng.choice(text.CUES[rng.integers(len(text.CUES))])))
    n_requirements = 1 + int(3 * difficulty + rng.random())
    lines += [str(r) for r in rng.choice(text.REQUIREMENTS, n_requirements, replace=False)]
    lines = list(dict.fromkeys(lines))  # no cue twice
    rng.shuffle(lines)
    body = "\n".join(f"- {line}" for line in lines)
    task_text = f"Write {summary} in {language}.\nRequirements:\n{body}"
    return CodegenTask(task_id, task_text, difficulty, language, domain)


def _cue(rng: np.random.Generator, difficulty: float) -> str:
    noisy = difficulty + rng.normal(0.0, 0.15)
    tier = 0 if noisy < 0.35 else 1 if noisy < 0.7 else 2
    return str(rng.choice(text.CUES[tier]))


def sample_path(task: CodegenTask, rng: np.random.Generator) -> tuple[tuple[str, ...], str]:
    """Route one workflow: return its agent path and end reason."""
    path = ["planner", "coder", "tester"]
    for retry in range(MAX_RETRIES + 1):
        if rng.random() >= failure_probability(task.difficulty, task.language, task.domain, retry):
            return tuple(path), "end"
        if retry == MAX_RETRIES:
            break
        path += ["analyzer", "coder", "tester"]
    return tuple(path), "recursion_limit"


class CodegenApp:
    """Planner → Coder → Tester with an Analyzer retry loop (see the module docstring)."""

    name = "codegen"
    agents = AGENTS
    entry_agents = ("planner",)
    edges = (
        ("planner", "coder"),
        ("coder", "tester"),
        ("tester", "analyzer"),
        ("tester", END),
        ("analyzer", "coder"),
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
        task_rng, route_rng, output_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence([seed, index]).spawn(3)
        )
        task = sample_task(task_rng, f"{seed}-{index}")
        path, end_reason = sample_path(task, route_rng)
        return Workflow(
            workflow_id=f"{self.name}-{seed}-{index}",
            app=self.name,
            task_id=task.task_id,
            task_text=task.text,
            steps=_build_steps(task, path, output_rng),
            task_features={
                "difficulty": task.difficulty,
                "language": task.language,
                "domain": task.domain,
            },
            end_reason=end_reason,
        )


def _build_steps(
    task: CodegenTask, path: tuple[str, ...], rng: np.random.Generator
) -> tuple[Step, ...]:
    """Build the steps of ``path``; each context extends the previous one."""
    preamble, roles = _fixed_segments()
    history = encode(f"<|im_start|>user\n## Task\n{task.text}<|im_end|>\n")
    steps: list[Step] = []
    for agent in path:
        opener = _opener(agent)
        low, high = GAP_BEFORE_S.get(agent, (0.0, 0.0)) if steps else (0.0, 0.0)
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
        if agent == "tester":
            history += _test_log(rng)
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


def _output(agent: str, task: CodegenTask, rng: np.random.Generator) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``."""
    low, high = OUTPUT_TOKENS[agent]
    n_tokens = int(rng.integers(low, high + 1)) + int(
        DIFFICULTY_BONUS_TOKENS[agent] * task.difficulty
    )
    if agent == "coder":
        header = f"Editing the {task.language} sources for the {task.domain} task.\n```\n"
    else:
        header = ""
    body = _filler(header, text.OUTPUT_BLOCKS[agent], n_tokens - len(_im_end()), rng)
    return body + _im_end()


def _test_log(rng: np.random.Generator) -> tuple[int, ...]:
    """Return a ``tool`` message holding a failed test run's log."""
    n_tokens = int(rng.integers(TEST_LOG_TOKENS[0], TEST_LOG_TOKENS[1] + 1))
    start = _encode_cached("<|im_start|>tool\n")
    end = _encode_cached("\n=== FAILED ===<|im_end|>\n")
    return start + _filler("", text.TEST_LOG_LINES, n_tokens, rng) + end


def _filler(
    header: str, lines: tuple[str, ...], n_tokens: int, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return ``header`` then random filled-in ``lines`` as exactly ``n_tokens`` ids.

    Template pieces and slot values are tokenized once and concatenated, so an output
    costs no tokenizer call; the ids are real and decode to the filled-in text.
    """
    draw = random.Random(int(rng.integers(2**63)))
    ids = list(_encode_cached(header))
    while len(ids) < n_tokens:
        ids += _fill(draw.choice(lines), draw)
    return tuple(ids[:n_tokens])


def _fill(template: str, draw: random.Random) -> list[int]:
    """Return the ids of ``template`` with its slots filled in, newline included."""
    name = draw.choice(text.IDENTIFIERS)
    values = {
        "name": name,
        "Name": name.title().replace("_", ""),
        "module": f"src/{name}_{draw.randrange(100)}.py",
        "topic": draw.choice(text.TOPICS),
        "n": str(draw.randrange(1, 64)),
        "m": str(draw.randrange(64, 512)),
    }
    ids: list[int] = []
    for literal, slot in _template_pieces(template):
        ids += literal
        if slot:
            ids += _encode_cached(values[slot])
    return ids


@functools.cache
def _template_pieces(template: str) -> tuple[tuple[tuple[int, ...], str | None], ...]:
    """Split ``template`` (plus a newline) into (literal ids, following slot name) pairs."""
    parsed = string.Formatter().parse(template + "\n")
    return tuple((_encode_cached(literal), slot) for literal, slot, _, _ in parsed)


@functools.cache
def _encode_cached(piece: str) -> tuple[int, ...]:
    return encode(piece)


register_app(CodegenApp.name, CodegenApp)
