"""The ``swebench`` app: an AutoGen-style group chat that resolves a GitHub issue (§8).

A Manager picks every speaker: Manager ⇒ {Localizer, Coder, Tester, Reviewer} and each
worker hands back to the Manager. The chat runs Localizer (one or more searches) → Coder
→ Tester; a failed test run goes back to the Coder, a passing one to the Reviewer, who
ends the chat (``APPROVED``) or sends the patch back to the Coder. After
:data:`MAX_CODER_TURNS` patches the chat stops with ``recursion_limit`` at the next
failed test run or rejected review.

Each issue has hidden features: ``difficulty`` in [0, 1], ``n_files`` (1 to 4 modules the
fix touches) and ``repo``. ``n_files`` sets how often the Localizer is called (one search
per file, each found with probability :data:`SEARCH_HIT_PROBABILITY` after the first);
difficulty (and a little ``n_files``) sets the test-failure and review-rejection
probabilities. The issue text carries noisy cues: "one-liner" or "intermittent" phrases,
module paths (about one per file, give or take one) and a traceback that grows with
difficulty.

Tools run between turns: each worker's tool result (search hits, the patch result, the
test log) enters the context as a ``tool`` message after its step, and its latency
(:data:`TOOL_GAP_S`, 2–20 s for searches and test runs) is the ``gap_s`` of the next
Manager call.

Prompt of every invocation, in SmolLM2's chat format, tokenized piece by piece so that
shared parts have identical ids:

- ``preamble``: ``<|im_start|>system`` + the shared team guidelines and tools;
- ``role``: the agent's role prompt + ``<|im_end|>``;
- ``context``: the issue as a user message, then every earlier message of the chat as an
  assistant message (``<|im_start|>assistant\\n{Agent}:\\n`` + its output, which ends
  with ``<|im_end|>\\n``; the Manager's selections included), each tool result as a
  ``tool`` message, and finally the opener of the current agent's message.

So the prompt plus output of a step is a prefix of every later prompt of the same agent.
Output token ids are synthetic but real tokens, deterministic per
``(seed, workflow, step)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from pbkv.actors.workload import Step
from pbkv.examples import swebench_prompts as text
from pbkv.examples.apps import RoutedApp, register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    Transcript,
    render_message,
    speaker_name,
    system_prompt,
    tool_message,
)
from pbkv.examples.filler import LineValues, fill_lines, from_pools
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier
from pbkv.examples.tokenizer import encode
from pbkv.predictor.trace import END

AGENTS = ("manager", "localizer", "coder", "tester", "reviewer")
WORKERS = AGENTS[1:]
MAX_CODER_TURNS = 5
"""Patches (Coder turns) before the chat ends with ``recursion_limit``."""
FILE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
"""How often a fix touches 1, 2, 3 and 4 files."""
SEARCH_HIT_PROBABILITY = 0.8
"""Probability that each file after the first needs one more Localizer search."""

OUTPUT_TOKENS = {  # (low, high) before the difficulty bonus
    "manager": (10, 30),
    "localizer": (80, 200),
    "coder": (200, 450),
    "tester": (80, 200),
    "reviewer": (60, 180),
}
DIFFICULTY_BONUS_TOKENS = {"localizer": 60, "coder": 200, "tester": 60, "reviewer": 60}
TOOL_GAP_S = {  # latency of the tool a worker ran, before the next Manager call: (low, high)
    "localizer": (2.0, 8.0),  # repository search and file reads
    "coder": (0.5, 2.0),  # applying the patch
    "tester": (5.0, 20.0),  # the test run in a fresh container
}
SELECTION_GAP_S = (0.02, 0.1)
"""Group-chat overhead after a message without a tool call (the Manager's, the Reviewer's)."""
TOOL_TOKENS = {  # tokens of each worker's tool result: (low, high)
    "localizer": (150, 400),
    "coder": (15, 40),
    "tester": (100, 350),
}


@dataclass(frozen=True, slots=True)
class SwebenchTask:
    """One GitHub issue and its hidden features.

    Args:
        task_id: stable id for the same seed.
        text: the issue as the agents see it (carries noisy cues of the features).
        difficulty: in [0, 1]; drives test failures and review rejections.
        n_files: modules the fix touches (1 to 4); drives the Localizer's searches.
        repo: a key of :data:`swebench_prompts.REPOS`.
    """

    task_id: str
    text: str
    difficulty: float
    n_files: int
    repo: str

    def features(self) -> dict[str, float | str]:
        """Return the hidden features, as ``Workflow.task_features``."""
        return {"difficulty": self.difficulty, "n_files": float(self.n_files), "repo": self.repo}


def failure_probability(difficulty: float, n_files: int, attempt: int) -> float:
    """Return the probability that the test run of patch ``attempt`` (from 0) fails.

    Rises with difficulty and with each file beyond the first, falls by 0.08 per earlier
    patch; clipped to [0.02, 0.92].
    """
    p = 0.05 + 0.7 * difficulty + 0.05 * (n_files - 1)
    return float(np.clip(p - 0.08 * attempt, 0.02, 0.92))


def rejection_probability(difficulty: float, n_files: int) -> float:
    """Return the probability that the Reviewer asks for changes to a tested patch."""
    return float(np.clip(0.05 + 0.3 * difficulty + 0.04 * (n_files - 1), 0.02, 0.6))


def sample_task(rng: np.random.Generator, task_id: str) -> SwebenchTask:
    """Draw an issue: features first, then a text whose cues depend on them (with noise)."""
    difficulty = float(rng.random())
    n_files = 1 + int(rng.choice(len(FILE_WEIGHTS), p=FILE_WEIGHTS))
    repo = str(rng.choice(list(text.REPOS)))
    function = str(rng.choice(text.FUNCTIONS))
    thing = str(rng.choice(text.THINGS))
    symptom = str(rng.choice(text.SYMPTOMS)).format(
        function=function,
        exception=str(rng.choice(text.EXCEPTIONS)),
        thing=thing,
        option=str(rng.choice(text.OPTIONS)),
    )
    lines = [_cue(rng, difficulty) for _ in range(1 + int(difficulty > 0.5))]
    n_mentioned = int(np.clip(n_files + rng.choice([-1, 0, 1], p=[0.2, 0.6, 0.2]), 1, 4))
    paths = rng.choice(text.REPOS[repo], n_mentioned, replace=False)
    lines += [str(rng.choice(text.FILE_CUES)).format(path=p) for p in paths]
    rng.shuffle(lines)
    body = " ".join(dict.fromkeys(lines))
    task_text = (
        f"{repo}: {symptom}\n\n{body}\n\n{_traceback(rng, difficulty, repo, function, thing)}"
    )
    return SwebenchTask(task_id, task_text, difficulty, n_files, repo)


def _cue(rng: np.random.Generator, difficulty: float) -> str:
    return str(rng.choice(text.CUES[noisy_tier(rng, difficulty)]))


def _traceback(
    rng: np.random.Generator, difficulty: float, repo: str, function: str, thing: str
) -> str:
    """Return a traceback whose depth grows with difficulty (with noise)."""
    n_frames = 1 + int(5 * difficulty + 2 * rng.random())
    frames = [
        f'  File "{rng.choice(text.REPOS[repo])}", line {rng.integers(20, 2000)}, in {function}'
        for _ in range(n_frames)
    ]
    exception = str(rng.choice(text.EXCEPTIONS))
    return "\n".join(
        [
            "Traceback (most recent call last):",
            *frames,
            f"{exception}: invalid {thing} passed to {function}()",
        ]
    )


def sample_path(task: SwebenchTask, rng: np.random.Generator) -> tuple[tuple[str, ...], str]:
    """Route one chat: return its agent path (Manager turns included) and end reason."""
    searches = 1 + int(rng.binomial(task.n_files - 1, SEARCH_HIT_PROBABILITY))
    workers = ["localizer"] * searches
    for attempt in range(MAX_CODER_TURNS):
        workers += ["coder", "tester"]
        if rng.random() < failure_probability(task.difficulty, task.n_files, attempt):
            continue
        workers.append("reviewer")
        if rng.random() >= rejection_probability(task.difficulty, task.n_files):
            return _with_manager(workers), "end"
    return _with_manager(workers), "recursion_limit"


def _with_manager(workers: list[str]) -> tuple[str, ...]:
    return tuple(agent for worker in workers for agent in ("manager", worker))


def _build_steps(
    task: SwebenchTask, path: tuple[str, ...], end_reason: str, rng: np.random.Generator
) -> tuple[Step, ...]:
    """Build the steps of ``path``; each context extends the previous one."""
    chat = Transcript(system_prompt(text), encode(render_message("user", f"## Issue\n{task.text}")))
    steps: list[Step] = []
    gap_bounds_s = (0.0, 0.0)
    for i, agent in enumerate(path):
        output = _output(agent, _header(path, i, end_reason), task, rng)
        steps.append(chat.take_turn(agent, output, draw_gap_s(rng, gap_bounds_s)))
        if agent in TOOL_TOKENS:
            passed = path[i + 2 : i + 3] == ("reviewer",)  # tests passed: review comes next
            chat.append(_tool_result(agent, passed, task, rng))
        gap_bounds_s = TOOL_GAP_S.get(agent, SELECTION_GAP_S)
    return tuple(steps)


def _header(path: tuple[str, ...], i: int, end_reason: str) -> str:
    """Return the first line of step ``i``'s output: the Manager's pick or the review verdict."""
    if path[i] == "manager":
        return f"Next speaker: {speaker_name(path[i + 1])}\n"
    if path[i] == "reviewer":
        return text.REVIEW_VERDICTS[i + 1 == len(path) and end_reason == "end"]
    return ""


def _output(
    agent: str, header: str, task: SwebenchTask, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return ``header`` and more, of realistic length for ``agent``, ending with ``<|im_end|>``."""
    bonus = DIFFICULTY_BONUS_TOKENS.get(agent, 0) * task.difficulty
    n_tokens = draw_tokens(rng, OUTPUT_TOKENS[agent], bonus)
    return fill_lines(
        header, text.OUTPUT_BLOCKS[agent], n_tokens, rng, _line_values(task), END_OF_TURN
    )


def _tool_result(
    agent: str, passed: bool, task: SwebenchTask, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return a ``tool`` message with the result of the tool ``agent`` ran.

    A Tester's test log ends with ``=== PASSED ===`` or ``=== FAILED ===`` by ``passed``.
    """
    n_tokens = draw_tokens(rng, TOOL_TOKENS[agent])
    lines = {
        "localizer": text.SEARCH_LINES,
        "coder": text.PATCH_LINES,
        "tester": text.TEST_PASS_LINES if passed else text.TEST_LOG_LINES,
    }[agent]
    closing = text.TEST_VERDICTS[passed] if agent == "tester" else ""
    return tool_message(fill_lines("", lines, n_tokens, rng, _line_values(task)), closing)


def _line_values(task: SwebenchTask) -> LineValues:
    """Return how output lines draw their slots: paths from the task's repository."""
    return from_pools(_pools(task.repo))


@functools.cache
def _pools(repo: str) -> dict[str, tuple[str, ...]]:
    """Return the values each template slot draws from, for an issue of ``repo``."""
    paths = text.REPOS[repo]
    return {
        "path": paths,
        "dir": tuple(sorted({p.rsplit("/", 1)[0] + "/" for p in paths})),
        "name": text.FUNCTIONS,
        "Name": tuple(f.title().replace("_", "") for f in text.FUNCTIONS),
        "thing": text.THINGS,
        "exception": text.EXCEPTIONS,
        "n": tuple(str(n) for n in range(2, 400)),
        "m": tuple(str(n) for n in range(400, 2000)),
        "k": ("1", "2", "3"),
    }


class SwebenchApp(RoutedApp[SwebenchTask]):
    """Manager-selected group chat with localize/code/test/review loops (see the module)."""

    name = "swebench"
    agents = AGENTS
    entry_agents = ("manager",)
    edges = (
        *(("manager", worker) for worker in WORKERS),
        *((worker, "manager") for worker in WORKERS),
        ("tester", END),  # a failed test run of the last allowed patch
        ("reviewer", END),
    )

    sample_task = staticmethod(sample_task)
    sample_path = staticmethod(sample_path)
    build_steps = staticmethod(_build_steps)


register_app(SwebenchApp.name, SwebenchApp)
