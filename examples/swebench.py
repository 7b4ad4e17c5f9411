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
import random
import string
from dataclasses import dataclass

import numpy as np

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.examples import swebench_prompts as text
from pbkv.examples.apps import check_count, register_app
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
    noisy = difficulty + rng.normal(0.0, 0.15)
    tier = 0 if noisy < 0.35 else 1 if noisy < 0.7 else 2
    return str(rng.choice(text.CUES[tier]))


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


class SwebenchApp:
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
            steps=_build_steps(task, path, end_reason, output_rng),
            task_features={
                "difficulty": task.difficulty,
                "n_files": float(task.n_files),
                "repo": task.repo,
            },
            end_reason=end_reason,
        )


def _build_steps(
    task: SwebenchTask, path: tuple[str, ...], end_reason: str, rng: np.random.Generator
) -> tuple[Step, ...]:
    """Build the steps of ``path``; each context extends the previous one."""
    preamble, roles = _fixed_segments()
    history = encode(f"<|im_start|>user\n## Issue\n{task.text}<|im_end|>\n")
    steps: list[Step] = []
    gap = (0.0, 0.0)
    for i, agent in enumerate(path):
        opener = _opener(agent)
        output = _output(agent, _header(path, i, end_reason), task, rng)
        steps.append(
            Step(
                agent=agent,
                segments=(preamble, roles[agent], Segment("context", history + opener)),
                output_token_ids=output,
                gap_s=round(float(rng.uniform(*gap)), 3),
            )
        )
        history += opener + output
        if agent in TOOL_TOKENS:
            passed = path[i + 2 : i + 3] == ("reviewer",)  # tests passed: review comes next
            history += _tool_result(agent, passed, task, rng)
        gap = TOOL_GAP_S.get(agent, SELECTION_GAP_S)
    return tuple(steps)


def _header(path: tuple[str, ...], i: int, end_reason: str) -> str:
    """Return the first line of step ``i``'s output: the Manager's pick or the review verdict."""
    if path[i] == "manager":
        return f"Next speaker: {path[i + 1].capitalize()}\n"
    if path[i] == "reviewer":
        return text.REVIEW_VERDICTS[i + 1 == len(path) and end_reason == "end"]
    return ""


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


def _output(
    agent: str, header: str, task: SwebenchTask, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return ``header`` and more, of realistic length for ``agent``, ending with ``<|im_end|>``."""
    low, high = OUTPUT_TOKENS[agent]
    n_tokens = int(rng.integers(low, high + 1)) + int(
        DIFFICULTY_BONUS_TOKENS.get(agent, 0) * task.difficulty
    )
    body = _filler(header, text.OUTPUT_BLOCKS[agent], n_tokens - len(_im_end()), task, rng)
    return body + _im_end()


def _tool_result(
    agent: str, passed: bool, task: SwebenchTask, rng: np.random.Generator
) -> tuple[int, ...]:
    """Return a ``tool`` message with the result of the tool ``agent`` ran.

    A Tester's test log ends with ``=== PASSED ===`` or ``=== FAILED ===`` by ``passed``.
    """
    low, high = TOOL_TOKENS[agent]
    n_tokens = int(rng.integers(low, high + 1))
    lines = {
        "localizer": text.SEARCH_LINES,
        "coder": text.PATCH_LINES,
        "tester": text.TEST_PASS_LINES if passed else text.TEST_LOG_LINES,
    }[agent]
    end = f"{text.TEST_VERDICTS[passed]}<|im_end|>\n" if agent == "tester" else "<|im_end|>\n"
    body = _filler("", lines, n_tokens, task, rng)
    return _encode_cached("<|im_start|>tool\n") + body + _encode_cached(end)


def _filler(
    header: str,
    lines: tuple[str, ...],
    n_tokens: int,
    task: SwebenchTask,
    rng: np.random.Generator,
) -> tuple[int, ...]:
    """Return ``header`` then random filled-in ``lines`` as exactly ``n_tokens`` ids.

    A header longer than ``n_tokens`` is returned whole; paths come from the task's
    repository. Template pieces and slot values are tokenized once and concatenated, so
    an output costs no tokenizer call; the ids are real and decode to the filled-in text.
    """
    draw = random.Random(int(rng.integers(2**63)))
    ids = list(_encode_cached(header))
    n_tokens = max(n_tokens, len(ids))
    while len(ids) < n_tokens:
        ids += _fill(draw.choice(lines), task.repo, draw)
    return tuple(ids[:n_tokens])


def _fill(template: str, repo: str, draw: random.Random) -> list[int]:
    """Return the ids of ``template`` with its slots filled in, newline included.

    A slot that appears twice in ``template`` gets the same value both times.
    """
    values: dict[str, str] = {}
    ids: list[int] = []
    for literal, slot in _template_pieces(template):
        ids += literal
        if slot:
            if slot not in values:
                values[slot] = draw.choice(_pools(repo)[slot])
            ids += _encode_cached(values[slot])
    return ids


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


@functools.cache
def _template_pieces(template: str) -> tuple[tuple[tuple[int, ...], str | None], ...]:
    """Split ``template`` (plus a newline) into (literal ids, following slot name) pairs."""
    parsed = string.Formatter().parse(template + "\n")
    return tuple((_encode_cached(literal), slot) for literal, slot, _, _ in parsed)


@functools.cache
def _encode_cached(piece: str) -> tuple[int, ...]:
    return encode(piece)


register_app(SwebenchApp.name, SwebenchApp)
