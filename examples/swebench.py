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

A :class:`pbkv.live.App` graph: the Manager's router reads its ``Next speaker:`` line;
each worker's tool (``search``, ``patch``, ``test_run``) runs after it and its result
(search hits, the patch result, the test log) enters the context as a ``tool`` message;
the test log's verdict (``=== PASSED ===``) and the Reviewer's (``APPROVED``) route
on, and every failed run or rejected review passes ``retry``, a tool without output
whose visit cap (``MAX_CODER_TURNS - 1``) ends the chat with ``recursion_limit``. A
tool's latency (:data:`TOOL_GAP_S`, 2–20 s for searches and test runs) is drawn with the
next Manager call, whose ``gap_s`` it is.

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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pbkv.assets import decode
from pbkv.examples import swebench_prompts as text
from pbkv.examples.apps import register_app
from pbkv.examples.chat import (
    END_OF_TURN,
    speaker_name,
    system_prompt,
    task_opening,
    tool_message,
    transcript_prompt,
)
from pbkv.examples.filler import LineValues, fill_lines, from_pools
from pbkv.examples.gaps import AppGaps
from pbkv.examples.sampling import draw_gap_s, draw_tokens, noisy_tier, spawn_rngs
from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.session import Reply, Simulated

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


STREAMS = ("task", "route", "output")
"""A workflow's draws: its issue, its verdicts, its outputs (children of ``(seed, i)``)."""
TOOLS = {"localizer": "search", "coder": "patch", "tester": "test_run"}
"""The tool each worker runs after its turn."""
_AGENT_BY_SPEAKER = {speaker_name(a): a for a in WORKERS}
_FALLBACK = {None: "localizer", "localizer": "coder", "coder": "tester", "tester": "reviewer"}
"""A real Manager's pick when its reply names nobody: the next worker of the usual order."""


def swebench_task(seed: int, index: int) -> LiveTask:
    """Return issue ``index`` of the workload drawn with ``seed`` (the ``task`` stream)."""
    task = sample_task(spawn_rngs(seed, index, 1)[0], f"{seed}-{index}")
    return LiveTask(task.task_id, task.text, task.features(), (seed, index), STREAMS)


def _last_worker(state: State) -> str | None:
    return next((t.node for t in reversed(state.turns) if t.node in WORKERS), None)


def next_speaker(state: State) -> str:
    """Draw the Manager's pick on the sim: the searches the fix needs (``route`` stream,
    at the first pick), then Coder → Tester, the Reviewer after a passing test run, and
    the Coder again after a failed one or a rejected review."""
    worker = _last_worker(state)
    if worker is None:
        f = state.task.features
        state.values["searches"] = 1 + int(
            state.rng("route").binomial(int(f["n_files"]) - 1, SEARCH_HIT_PROBABILITY)
        )
        return "localizer"
    if worker == "localizer":
        more = state.visits["localizer"] < state.values["searches"]
        return "localizer" if more else "coder"
    if worker == "coder":
        return "tester"
    if worker == "tester":
        passed = text.TEST_VERDICTS[True] in state.turns[-1].text
        return "reviewer" if passed else "coder"
    return "coder"


def simulate_agent(agent: str, gaps: AppGaps | None = None) -> Any:
    """Return ``agent``'s simulated reply: its first line (the Manager's pick, the
    Reviewer's verdict), the rest of its output, then the gap before it
    (:data:`TOOL_GAP_S`'s draw for the last worker's tool, or ``gaps``' cited one)."""
    gaps = gaps or AppGaps("swebench")

    def simulate(state: State) -> Simulated:
        f = state.task.features
        header = ""
        if agent == "manager":
            header = f"Next speaker: {speaker_name(next_speaker(state))}\n"
        elif agent == "reviewer":
            rejected = state.rng("route").random() < rejection_probability(
                f["difficulty"], int(f["n_files"])
            )
            header = text.REVIEW_VERDICTS[not rejected]
        rng = state.rng("output")
        output = _output(agent, header, f, rng)
        last = next((t.node for t in reversed(state.turns) if t.kind == "agent"), None)
        bounds_s = TOOL_GAP_S.get(last, SELECTION_GAP_S) if last is not None else (0.0, 0.0)
        return Simulated(token_ids=output, gap_s=gaps.gap_s(last, draw_gap_s(rng, bounds_s), state))

    return simulate


def simulate_tool(agent: str) -> Any:
    """Return the sim's result of the tool ``agent`` runs (a test run draws its verdict
    from the ``route`` stream first)."""

    def simulate(state: State) -> ToolResult:
        f = state.task.features
        passed = True
        if agent == "tester":
            p = failure_probability(f["difficulty"], int(f["n_files"]), state.visits["coder"] - 1)
            passed = not state.rng("route").random() < p
        ids = _tool_result(agent, passed, f, state.rng("output"))
        return ToolResult(TOOLS[agent], decode(ids), 0.0, ids)

    return simulate


def run_tool(agent: str) -> Any:
    """Return the tool ``agent`` runs on a real engine: the repository's lines as a
    stand-in; the test run fails when the Tester reports a failure."""

    async def run(state: State) -> str:
        f = state.task.features
        passed = True
        if agent == "tester":
            report = state.last.text if state.last is not None else ""
            passed = re.search(r"\bfail", report, re.IGNORECASE) is None
        body, closing = _tool_body(agent, passed, f, state.rng("tools"))
        return decode(body) + closing  # the driver renders it as a tool message

    return run


def route_manager(state: State, out: Reply | ToolResult) -> str:
    """Hand the turn to the worker the Manager's ``Next speaker:`` line names."""
    match = re.search(r"Next speaker:\s*(\w+)", out.text)
    worker = _AGENT_BY_SPEAKER.get(match.group(1)) if match else None
    return worker or _FALLBACK.get(_last_worker(state), "coder")


def route_test_run(state: State, out: Reply | ToolResult) -> str:
    """Back to the Manager after a passing run; through ``retry`` after a failed one."""
    return "manager" if text.TEST_VERDICTS[True] in out.text else "retry"


def route_reviewer(state: State, out: Reply | ToolResult) -> str:
    """End the chat on approval; retry the patch otherwise."""
    first = out.text.split("\n", 1)[0]
    return END if "APPROVED" in first and "CHANGES" not in first else "retry"


async def no_output(state: State) -> str:
    """The ``retry`` tool: it only counts the retries (no message enters the context)."""
    return ""


def _output(
    agent: str, header: str, task: Mapping[str, Any], rng: np.random.Generator
) -> tuple[int, ...]:
    """Return ``header`` and more, of realistic length for ``agent``, ending with ``<|im_end|>``."""
    bonus = DIFFICULTY_BONUS_TOKENS.get(agent, 0) * task["difficulty"]
    n_tokens = draw_tokens(rng, OUTPUT_TOKENS[agent], bonus)
    return fill_lines(
        header, text.OUTPUT_BLOCKS[agent], n_tokens, rng, _line_values(task["repo"]), END_OF_TURN
    )


def _tool_result(
    agent: str, passed: bool, task: Mapping[str, Any], rng: np.random.Generator
) -> tuple[int, ...]:
    """Return a ``tool`` message with the result of the tool ``agent`` ran
    (:func:`_tool_body`, its last line ending with the closing)."""
    return tool_message(*_tool_body(agent, passed, task, rng))


def _tool_body(
    agent: str, passed: bool, task: Mapping[str, Any], rng: np.random.Generator
) -> tuple[tuple[int, ...], str]:
    """Return the ids of the result's lines and what its last line ends with.

    A Tester's test log ends with ``=== PASSED ===`` or ``=== FAILED ===`` by ``passed``.
    """
    n_tokens = draw_tokens(rng, TOOL_TOKENS[agent])
    lines = {
        "localizer": text.SEARCH_LINES,
        "coder": text.PATCH_LINES,
        "tester": text.TEST_PASS_LINES if passed else text.TEST_LOG_LINES,
    }[agent]
    closing = text.TEST_VERDICTS[passed] if agent == "tester" else ""
    return fill_lines("", lines, n_tokens, rng, _line_values(task["repo"])), closing


def _line_values(repo: str) -> LineValues:
    """Return how output lines draw their slots: paths from the issue's repository."""
    return from_pools(_pools(repo))


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


class SwebenchApp(App):
    """Manager-selected group chat with localize/code/test/review loops (see the module).

    Args:
        gap_model: ``bundled`` (:data:`TOOL_GAP_S`) or ``cited``
            (:mod:`pbkv.examples.gaps`).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(self, gap_model: str = "bundled") -> None:
        super().__init__("swebench", preamble=text.render_preamble(), recursion_limit=128)
        gaps = AppGaps("swebench", gap_model)
        system, opening = system_prompt(text), task_opening("Issue")
        for agent in AGENTS:
            self.agent(
                agent,
                role=text.ROLE_PROMPTS[agent],
                prompt=transcript_prompt(system, agent, opening),
                max_new_tokens=OUTPUT_TOKENS[agent][1] + DIFFICULTY_BONUS_TOKENS.get(agent, 0),
                simulate=simulate_agent(agent, gaps),
            )
        for worker, tool in TOOLS.items():
            self.tool(tool, run_tool(worker), simulate=simulate_tool(worker))
        self.tool(
            "retry",
            no_output,
            simulate=lambda state: ToolResult("retry", "", 0.0),
            max_visits=MAX_CODER_TURNS - 1,
        )
        self.edge(START, "manager").route("manager", route_manager, WORKERS)
        self.edge("localizer", "search").edge("search", "manager")
        self.edge("coder", "patch").edge("patch", "manager")
        self.edge("tester", "test_run").route("test_run", route_test_run, ["manager", "retry"])
        self.route("reviewer", route_reviewer, [END, "retry"])
        self.edge("retry", "manager")
        self.tasks(swebench_task)


register_app("swebench", SwebenchApp)
