"""The ``codegen`` app (paper Fig. 1): Planner → Coder → Tester ⇒ {Analyzer → Coder → Tester, END}.

A :class:`pbkv.live.App` graph: Planner → Coder → Tester → ``test_run`` (a tool) ⇒
{Analyzer → Coder → …, END}; the router reads the test run's log (``=== FAILED ===``),
and the Analyzer's visit cap (:data:`MAX_RETRIES`) ends a workflow whose last allowed
retry failed with ``recursion_limit``.

Each task has hidden features (``difficulty`` in [0, 1], ``language``, ``domain``). On
the sim engine they set the probability that a test run fails, which falls a little
with each retry; they also leave noisy cues in the task text ("simple", "edge cases",
"tricky concurrency"): a learnable signal, not a label. On a real engine the test run
reads the Tester's report (a stand-in for running the suite; a demo may declare a tool
that runs it).

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared guidelines and tool documentation;
- ``role``: the agent's role prompt + ``<|im_end|>``;
- ``context``: the task as a user message, then every earlier step as an assistant
  message (``<|im_start|>assistant\\n{Agent}:\\n`` + its output, which ends with
  ``<|im_end|>\\n``), a failed test run as a ``tool`` message after its Tester step, and
  finally the opener of the current agent's message.

So the prompt plus output of a step is a prefix of every later prompt of the same agent.
Simulated outputs are synthetic but real tokens (templated plan, code, test and analysis
lines), drawn from the workflow's ``output`` stream; the test verdicts from its ``route``
stream (:data:`STREAMS`), so workflow ``i`` of ``seed`` depends only on ``(seed, i)``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pbkv.assets import decode
from pbkv.examples import codegen_prompts as text
from pbkv.examples.apps import register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    system_prompt,
    task_opening,
    tool_message,
    transcript_prompt,
)
from pbkv.examples.filler import fill_lines
from pbkv.examples.gaps import AppGaps
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.session import Reply, Simulated

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


STREAMS = ("task", "route", "output")
"""A workflow's draws: its task, its test verdicts, its outputs (children of ``(seed, i)``)."""
FAILED = "=== FAILED ==="
PASSED = "=== PASSED ==="


def codegen_task(seed: int, index: int) -> LiveTask:
    """Return task ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    task = sample_task(spawn_rngs(seed, index, 1)[0], f"{seed}-{index}")
    return LiveTask(task.task_id, task.text, task.features(), (seed, index), STREAMS)


def test_fails(state: State) -> bool:
    """Draw whether this test run fails (sim): the ``route`` stream, one draw per run."""
    f = state.task.features
    retry = state.visits["test_run"]
    p = failure_probability(f["difficulty"], f["language"], f["domain"], retry)
    return bool(state.rng("route").random() < p)


def simulate_agent(agent: str, gaps: AppGaps | None = None) -> Any:
    """Return ``agent``'s simulated reply: an output, then the gap before it
    (:data:`GAP_BEFORE_S`'s draw, or ``gaps``' cited one: the Analyzer's test run)."""
    gaps = gaps or AppGaps("codegen")

    def simulate(state: State) -> Simulated:
        rng = state.rng("output")
        output = _output(agent, state.task.features, rng)
        bounds_s = GAP_BEFORE_S.get(agent, (0.0, 0.0)) if state.turns else (0.0, 0.0)
        key = agent if state.turns else None
        return Simulated(token_ids=output, gap_s=gaps.gap_s(key, draw_gap_s(rng, bounds_s), state))

    return simulate


def simulate_test_run(state: State) -> ToolResult:
    """Return the test run's result on the sim: a failed run's log, or a pass."""
    if not test_fails(state):
        return ToolResult("test_run", PASSED, 0.0)
    ids = _test_log(state.rng("output"))
    return ToolResult("test_run", decode(ids), 0.0, ids)


async def run_tests(state: State) -> str:
    """Return the test run's log on a real engine: failed when the Tester reports one."""
    report = state.last.text if state.last is not None else ""
    if re.search(r"\bfail", report, re.IGNORECASE):
        return f"The Tester's checks report failures.\n{FAILED}"
    return PASSED


def route_test_run(state: State, out: Reply | ToolResult) -> str:
    """Retry (Analyzer) after a failed test run; end after a pass."""
    return "analyzer" if FAILED in out.text else END


def _output(agent: str, task: Mapping[str, Any], rng: np.random.Generator) -> tuple[int, ...]:
    """Return an output of realistic length for ``agent``, ending with ``<|im_end|>``."""
    n_tokens = draw_tokens(
        rng, OUTPUT_TOKENS[agent], DIFFICULTY_BONUS_TOKENS[agent] * task["difficulty"]
    )
    if agent == "coder":
        header = f"Editing the {task['language']} sources for the {task['domain']} task.\n```\n"
    else:
        header = ""
    return fill_lines(header, text.OUTPUT_BLOCKS[agent], n_tokens, rng, _line_values, END_OF_TURN)


def _test_log(rng: np.random.Generator) -> tuple[int, ...]:
    """Return a ``tool`` message holding a failed test run's log."""
    n_tokens = draw_tokens(rng, TEST_LOG_TOKENS)
    log = fill_lines("", text.TEST_LOG_LINES, n_tokens, rng, _line_values)
    return tool_message(log, f"\n{FAILED}")


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


class CodegenApp(App):
    """Planner → Coder → Tester with an Analyzer retry loop (see the module docstring).

    Args:
        gap_model: ``bundled`` (:data:`GAP_BEFORE_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("codegen", preamble=text.render_preamble())
        gaps = AppGaps("codegen", gap_model)
        system, opening = system_prompt(text), task_opening("Task")
        for agent in AGENTS:
            high = OUTPUT_TOKENS[agent][1]
            self.agent(
                agent,
                role=text.ROLE_PROMPTS[agent],
                prompt=transcript_prompt(system, agent, opening),
                max_new_tokens=high + DIFFICULTY_BONUS_TOKENS[agent],
                simulate=simulate_agent(agent, gaps),
                max_visits=MAX_RETRIES if agent == "analyzer" else None,
            )
        self.tool("test_run", run_tests, simulate=simulate_test_run)
        self.edge(START, "planner").edge("planner", "coder").edge("coder", "tester")
        self.edge("tester", "test_run").route("test_run", route_test_run, ["analyzer", END])
        self.edge("analyzer", "coder")
        self.tasks(codegen_task)


register_app("codegen", CodegenApp)
