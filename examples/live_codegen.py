"""``live-codegen``: Planner → Coder → Tester with a retry loop, on the graph API (§4.0).

The live demo's app (``pbkv demo``). The Planner writes a plan, the Coder writes a Python
function, and the Tester is a **tool that really runs the tests**: it takes the code
block out of the Coder's reply and runs it against the task's test cases in a separate
Python process, with a timeout and resource limits. The router reads the Tester's real
report: ``PASS`` ends the workflow; anything else goes to the Analyzer, who explains
the failure to the Coder for one more try (the Analyzer's visit cap is the retry cap:
past it the workflow ends ``recursion_limit``). So the path a workflow takes depends on
the code the model actually wrote.

On the sim engine (no text) the agents have simulated replies and the Tester a
simulated verdict, drawn from the task's hidden difficulty: harder tasks fail more
often, and each retry passes more often (as the generated ``codegen`` app).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from pbkv.live.graph import END, START, App, LiveTask, State, ToolResult
from pbkv.live.prompts import speaker_name
from pbkv.live.session import Reply, Simulated

__all__ = [
    "PROBLEMS",
    "Problem",
    "extract_code",
    "live_codegen_app",
    "live_codegen_tasks",
    "run_tests",
]

PREAMBLE = (
    "You are one agent of a small software team that writes short Python functions. "
    "The Planner plans, the Coder writes the code, a test runner executes the tests, and "
    "the Analyzer explains failures. Be brief and precise; use only the standard library."
)
ROLES = {
    "planner": "You are the Planner. In two or three short steps, say how to implement the "
    "requested function. Do not write code.",
    "coder": "You are the Coder. Write the complete Python function that was requested. "
    "Reply with one ```python code block and nothing else.",
    "analyzer": "You are the Analyzer. Read the test report and say in one or two sentences "
    "what is wrong with the code and how to fix it.",
}
TEST_TIMEOUT_S = 5.0
"""Wall-clock limit of one test run (the process is killed past it)."""
MEMORY_LIMIT_BYTES = 512 << 20
REPORT_CHARS = 240
"""Longest test report (longer ones are cut), so every prompt has a known bound."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One task: a function to write and its test cases.

    Args:
        name: the function's name (also the task id).
        prompt: what the agents are asked.
        tests: ``(call, expected)`` Python expressions; a case passes when
            ``eval(call) == eval(expected)``.
        difficulty: hidden, in ``[0, 1]``; drives the simulated verdicts only.
    """

    name: str
    prompt: str
    tests: tuple[tuple[str, str], ...]
    difficulty: float


PROBLEMS: tuple[Problem, ...] = (
    Problem(
        "add",
        "Write a Python function `add(a, b)` that returns the sum of a and b.",
        (("add(2, 3)", "5"), ("add(-1, 1)", "0"), ("add(10, 5)", "15")),
        0.1,
    ),
    Problem(
        "is_even",
        "Write a Python function `is_even(n)` that returns True when the integer n is even.",
        (("is_even(4)", "True"), ("is_even(7)", "False"), ("is_even(0)", "True")),
        0.1,
    ),
    Problem(
        "count_vowels",
        "Write a Python function `count_vowels(s)` that returns how many of the letters "
        "a, e, i, o, u (lower or upper case) the string s contains.",
        (("count_vowels('hello')", "2"), ("count_vowels('AEIOU')", "5"), ("count_vowels('')", "0")),
        0.4,
    ),
    Problem(
        "second_largest",
        "Write a Python function `second_largest(nums)` that returns the second largest "
        "distinct value of the list nums.",
        (("second_largest([3, 1, 4, 4])", "3"), ("second_largest([5, 9, 2])", "5")),
        0.7,
    ),
    Problem(
        "reverse_words",
        "Write a Python function `reverse_words(s)` that returns the words of the "
        "sentence s in reverse order, joined by single spaces.",
        (("reverse_words('a b c')", "'c b a'"), ("reverse_words('hello world')", "'world hello'")),
        0.5,
    ),
    Problem(
        "factorial",
        "Write a Python function `factorial(n)` that returns n! for an integer n >= 0.",
        (("factorial(0)", "1"), ("factorial(5)", "120"), ("factorial(3)", "6")),
        0.2,
    ),
    Problem(
        "is_palindrome",
        "Write a Python function `is_palindrome(s)` that returns True when s reads the same "
        "backwards, ignoring case and spaces.",
        (
            ("is_palindrome('Never odd or even')", "True"),
            ("is_palindrome('abc')", "False"),
            ("is_palindrome('Aa')", "True"),
        ),
        0.8,
    ),
    Problem(
        "fizzbuzz",
        "Write a Python function `fizzbuzz(n)` that returns 'Fizz' if n is divisible by 3, "
        "'Buzz' if by 5, 'FizzBuzz' if by both, and otherwise str(n).",
        (
            ("fizzbuzz(9)", "'Fizz'"),
            ("fizzbuzz(10)", "'Buzz'"),
            ("fizzbuzz(30)", "'FizzBuzz'"),
            ("fizzbuzz(7)", "'7'"),
        ),
        0.6,
    ),
)
_BY_NAME = {p.name: p for p in PROBLEMS}


def live_codegen_tasks(n: int, *, offset: int = 0) -> list[LiveTask]:
    """Return ``n`` tasks, cycling through :data:`PROBLEMS` from ``offset``.

    Task ids are ``<function>`` for the first round, ``<function>#<round>`` after.

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks = []
    for i in range(offset, offset + n):
        problem = PROBLEMS[i % len(PROBLEMS)]
        lap = i // len(PROBLEMS)
        task_id = problem.name if lap == 0 else f"{problem.name}#{lap}"
        features = {"difficulty": problem.difficulty, "function": problem.name}
        tasks.append(LiveTask(task_id, problem.prompt, features))
    return tasks


def problem_of(task: LiveTask) -> Problem:
    """Return the problem a task poses (by its ``function`` feature or its id).

    Raises:
        ValueError: the task is not one of :data:`PROBLEMS`.
    """
    name = str(task.features.get("function", task.task_id.split("#")[0]))
    problem = _BY_NAME.get(name)
    if problem is None:
        raise ValueError(
            f"task {task.task_id!r} is not a live-codegen problem; known: {sorted(_BY_NAME)}"
        )
    return problem


# -- the tester tool ---------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)

_RUNNER = r"""
import json, sys
source, tests = json.loads(sys.stdin.read())
namespace = {"__name__": "candidate"}
try:
    exec(compile(source, "candidate.py", "exec"), namespace)
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    raise SystemExit(0)
failures = []
for call, expected in tests:
    try:
        got = eval(call, namespace)
        want = eval(expected, {})
        if got != want:
            failures.append(f"{call} returned {got!r}, expected {want!r}")
    except BaseException as exc:
        failures.append(f"{call} raised {type(exc).__name__}: {exc}")
print(json.dumps({"failures": failures}))
"""


def extract_code(text: str) -> str:
    """Return the first fenced code block of ``text`` (an unclosed one runs to the end),
    or all of ``text`` when it has no fence."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip("\n")


def _limit_resources() -> None:  # pragma: no cover - runs in the child process
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (int(TEST_TIMEOUT_S) + 1, int(TEST_TIMEOUT_S) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


async def run_tests(
    code: str, tests: Sequence[tuple[str, str]], *, timeout_s: float = TEST_TIMEOUT_S
) -> str:
    """Run ``code`` against ``tests`` in a fresh Python process; return the report.

    The process runs isolated (``python -I -S``: no environment, no site packages, so
    the standard library only), in its own empty working folder, with CPU-time and
    address-space limits, and is killed after ``timeout_s``.

    Returns:
        ``PASS: n/n tests`` or ``FAIL: k/n tests`` followed by one line per failed case,
        or ``ERROR: ...`` when the code does not load, or ``TIMEOUT`` after ``timeout_s``;
        at most :data:`REPORT_CHARS` characters.
    """
    return _cut(await _run_tests(code, tests, timeout_s))


def _cut(report: str) -> str:
    return report if len(report) <= REPORT_CHARS else report[: REPORT_CHARS - 3] + "..."


async def _run_tests(code: str, tests: Sequence[tuple[str, str]], timeout_s: float) -> str:
    payload = json.dumps([code, list(tests)]).encode()
    limits = _limit_resources if sys.platform != "win32" else None
    with (
        tempfile.TemporaryDirectory(prefix="pbkv-tests-") as folder,
        trio.move_on_after(timeout_s) as scope,
    ):
        done = await trio.run_process(
            [sys.executable, "-I", "-S", "-c", _RUNNER],
            stdin=payload,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=str(folder),
            env={},
            preexec_fn=limits,
        )
    if scope.cancelled_caught:
        return f"TIMEOUT: the tests did not finish in {timeout_s:g} s"
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"ERROR: the test process exited with {done.returncode}: {tail[0]}"
    if "error" in report:
        return f"ERROR: {report['error']}"
    failures = report["failures"]
    passed = len(tests) - len(failures)
    if not failures:
        return f"PASS: {passed}/{len(tests)} tests"
    return "\n".join([f"FAIL: {passed}/{len(tests)} tests", *failures])


def _last_output(state: State, node: str) -> str:
    for turn in reversed(state.turns):
        if turn.node == node:
            return turn.text
    return ""


def make_tester(reports: dict[str, list[str]] | None = None) -> Callable[[State], Awaitable[str]]:
    """Return the Tester tool: run the Coder's latest code against the task's tests.

    Args:
        reports: if given, each report is also appended under its workflow's id.
    """

    async def tester(state: State) -> str:
        problem = problem_of(state.task)
        report = await run_tests(extract_code(_last_output(state, "coder")), problem.tests)
        if reports is not None:
            reports.setdefault(state.workflow_id, []).append(report)
        return report

    return tester


# -- simulated replies (sim engine) -------------------------------------------------------


def _simulated_verdict(state: State) -> tuple[str, float]:
    """Pass with a probability falling with difficulty and rising per retry."""
    difficulty = float(state.task.features.get("difficulty", 0.5))
    retries = state.visits["analyzer"]
    fail = min(0.95, max(0.02, 0.1 + 0.7 * difficulty - 0.2 * retries))
    passed = state.rng("tester").random() >= fail
    return ("PASS: 3/3 tests" if passed else "FAIL: 1/3 tests"), 0.3


def _simulated(text: str, output_tokens: int) -> Callable[[State], Simulated]:
    """Return a simulated reply of ``text`` padded to ``output_tokens``."""
    return lambda state: Simulated(text, output_tokens)


# -- the app ------------------------------------------------------------------------------


def shared_prompt(agent: str) -> Callable[[State], list[dict[str, str]]]:
    """Return ``agent``'s prompt builder for the shared-context layout: the task as a user
    message, each turn so far (an agent's as its signed assistant message, a tool's as
    a tool message) and ``agent``'s role as the closing user message."""

    def build(state: State) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": state.task.text}]
        for turn in state.turns:
            if turn.kind == "tool":
                messages.append({"role": "tool", "content": turn.text})
            else:
                signed = f"{speaker_name(turn.node)}:\n{turn.text}"
                messages.append({"role": "assistant", "content": signed})
        messages.append({"role": "user", "content": ROLES[agent]})
        return messages

    return build


def route_verdict(state: State, out: Reply | ToolResult) -> str:
    """Tester's report → ``END`` on ``PASS``, else the Analyzer."""
    return END if out.text.startswith("PASS") else "analyzer"


def live_codegen_app(
    *,
    max_retries: int = 1,
    plan_tokens: int = 32,
    code_tokens: int = 64,
    analysis_tokens: int = 32,
    reports: dict[str, list[str]] | None = None,
    shared_context: bool = False,
) -> App:
    """Build the app: Planner → Coder → tester ⇒ {Analyzer → Coder → tester, END}.

    Args:
        max_retries: Analyzer visits allowed (each gives the Coder one more try); one
            more failure ends the workflow ``recursion_limit``.
        plan_tokens / code_tokens / analysis_tokens: decode budgets of the agents.
        reports: if given, the tester's reports are appended to it per workflow id
            (real runs only; simulated verdicts are not).
        shared_context: every agent reads one conversation, its role last: the prompt
            is the preamble, the task, every turn so far and the role as a closing user
            message (:func:`shared_prompt`), so the agents of a workflow share its
            task and history as one cached prefix. ``False``: each agent's role opens
            its prompt (the graph's default), so only an agent's own calls share more
            than the preamble.

    Raises:
        ValueError: ``max_retries < 0`` or a budget < 1.
    """
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    app = App("live-codegen", preamble=PREAMBLE, recursion_limit=4 + 3 * max_retries)

    def role(agent: str) -> dict[str, Any]:
        if shared_context:
            return {"role": "", "prompt": shared_prompt(agent)}
        return {"role": ROLES[agent]}

    app.agent(
        "planner",
        **role("planner"),
        max_new_tokens=plan_tokens,
        simulate=_simulated("1. Read the input. 2. Compute the result. 3. Return it.", plan_tokens),
    )
    app.agent(
        "coder",
        **role("coder"),
        max_new_tokens=code_tokens,
        simulate=_simulated("```python\ndef f(x):\n    return x\n```", code_tokens),
    )
    app.tool("tester", make_tester(reports), simulate=_simulated_verdict)
    app.agent(
        "analyzer",
        **role("analyzer"),
        max_new_tokens=analysis_tokens,
        max_visits=max_retries,
        simulate=_simulated(
            "The function returns the wrong value; fix the formula.", analysis_tokens
        ),
    )
    app.edge(START, "planner").edge("planner", "coder").edge("coder", "tester")
    app.route("tester", route_verdict, ["analyzer", END])
    app.edge("analyzer", "coder")
    app.validate()
    return app
