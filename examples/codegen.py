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

import random
from dataclasses import dataclass

import numpy as np

from pbkv.actors.workload import Step
from pbkv.examples import codegen_prompts as text
from pbkv.examples.apps import RoutedApp, register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    Transcript,
    render_message,
    system_prompt,
    tool_message,
)
from pbkv.examples.filler import fill_lines
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier
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

    def features(self) -> dict[str, float | str]:
        """Return the hidden features, as ``Workflow.task_features``."""
        return {"difficulty": self.difficulty, "language": self.language, "domain": self.domain}


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
    return str(rng.choice(text.CUES[noisy_tier(rng, difficulty)]))


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


def _build_steps(
    task: CodegenTask, path: tuple[str, ...], end_reason: str, rng: np.random.Generator
) -> tuple[Step, ...]:
    """Build the steps of ``path``; each context extends the previous one.

    ``end_reason`` is not used: no output says how the workflow ends.
    """
    chat = Transcript(system_prompt(text), encode(render_message("user", f"## Task\n{task.text}")))
    steps: list[Step] = []
    for agent in path:
        gap_bounds_s = GAP_BEFORE_S.get(agent, (0.0, 0.0)) if steps else (0.0, 0.0)
        output = _output(agent, task, rng)
        steps.append(chat.take_turn(agent, output, draw_gap_s(rng, gap_bounds_s)))
        if agent == "tester":
            chat.append(_test_log(rng))
    return tuple(steps)


def _output(agent: str, task: CodegenTask, rng: np.random.Generator) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``."""
    n_tokens = draw_tokens(
        rng, OUTPUT_TOKENS[agent], DIFFICULTY_BONUS_TOKENS[agent] * task.difficulty
    )
    if agent == "coder":
        header = f"Editing the {task.language} sources for the {task.domain} task.\n```\n"
    else:
        header = ""
    return fill_lines(header, text.OUTPUT_BLOCKS[agent], n_tokens, rng, _line_values, END_OF_TURN)


def _test_log(rng: np.random.Generator) -> tuple[int, ...]:
    """Return a ``tool`` message holding a failed test run's log."""
    n_tokens = draw_tokens(rng, TEST_LOG_TOKENS)
    log = fill_lines("", text.TEST_LOG_LINES, n_tokens, rng, _line_values)
    return tool_message(log, "\n=== FAILED ===")


def _line_values(draw: random.Random) -> dict[str, str]:
    """Draw every slot's value for one line, whether the line uses the slot or not."""
    name = draw.choice(text.IDENTIFIERS)
    return {
        "name": name,
        "Name": name.title().replace("_", ""),
        "module": f"src/{name}_{draw.randrange(100)}.py",
        "topic": draw.choice(text.TOPICS),
        "n": str(draw.randrange(1, 64)),
        "m": str(draw.randrange(64, 512)),
    }


class CodegenApp(RoutedApp[CodegenTask]):
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

    sample_task = staticmethod(sample_task)
    sample_path = staticmethod(sample_path)
    build_steps = staticmethod(_build_steps)


register_app(CodegenApp.name, CodegenApp)
