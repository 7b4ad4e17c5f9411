"""The live demo's app (examples/live_codegen.py): real test runs, routing on their reports."""

import itertools

import pytest
import trio

import pbkv
from pbkv.examples.live_codegen import (
    PROBLEMS,
    REPORT_CHARS,
    ROLES,
    extract_code,
    live_codegen_app,
    live_codegen_tasks,
    problem_of,
    route_verdict,
    run_tests,
)
from pbkv.live import State, ToolResult
from pbkv.live.chat import smollm2_chat
from pbkv.live.driver import simulate_workflow

ADD_TESTS = (("add(2, 3)", "5"), ("add(2, 2)", "4"))
STATE = State(pbkv.LiveTask("add", "Write add."))


async def test_a_correct_function_passes():
    assert await run_tests("def add(a, b):\n    return a + b", ADD_TESTS) == "PASS: 2/2 tests"


async def test_a_wrong_function_fails_with_the_case_named():
    report = await run_tests("def add(a, b):\n    return a * b", ADD_TESTS)
    assert report == "FAIL: 1/2 tests\nadd(2, 3) returned 6, expected 5"


async def test_code_that_does_not_load_is_an_error():
    assert (await run_tests("def add(a, b)\n    return a", ADD_TESTS)).startswith(
        "ERROR: SyntaxError"
    )
    report = await run_tests("x = 1", ADD_TESTS)
    assert report.startswith("FAIL: 0/2") and "NameError" in report


async def test_code_that_never_ends_is_killed_at_the_timeout():
    with trio.fail_after(30):
        report = await run_tests("while True:\n    pass", ADD_TESTS, timeout_s=0.5)
    assert report.startswith("TIMEOUT")


async def test_the_test_process_sees_no_environment_and_an_empty_folder():
    code = "import os\nSEEN = (dict(os.environ), os.listdir('.'))\ndef add(a, b): return SEEN"
    report = await run_tests(code, (("add(0, 0)[1]", "[]"), ("len(add(0, 0)[0]) < 3", "True")))
    assert report == "PASS: 2/2 tests"


async def test_long_reports_are_cut():
    code = "def add(a, b):\n    return 'x' * 1000"
    assert len(await run_tests(code, ADD_TESTS)) == REPORT_CHARS


def test_extract_code_takes_the_fenced_block():
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nDone.") == (
        "def f():\n    return 1"
    )
    assert extract_code("```\ndef f(): pass") == "def f(): pass"  # cut off before the fence
    assert extract_code("def f(): pass") == "def f(): pass"


def test_router_reads_the_report():
    assert route_verdict(STATE, ToolResult("tester", "PASS: 3/3 tests", 0.1)) == pbkv.END
    assert route_verdict(STATE, ToolResult("tester", "FAIL: 1/3 tests", 0.1)) == "analyzer"
    assert route_verdict(STATE, ToolResult("tester", "TIMEOUT: ...", 0.1)) == "analyzer"


def test_tasks_cycle_through_the_problems():
    tasks = live_codegen_tasks(len(PROBLEMS) + 1)
    assert tasks[0].task_id == "add" and tasks[-1].task_id == "add#1"
    assert problem_of(tasks[-1]).name == "add"
    with pytest.raises(ValueError, match="not a live-codegen problem"):
        problem_of(pbkv.LiveTask("nope", "x"))


def test_call_graph_is_derived_from_the_edges():
    app = live_codegen_app()
    assert app.agents == ("planner", "coder", "analyzer")
    assert app.edges == (
        ("analyzer", "coder"),
        ("coder", pbkv.END),
        ("coder", "analyzer"),
        ("planner", "coder"),
    )


async def test_on_the_sim_engine_paths_follow_the_simulated_verdicts(autojump_clock):
    app = live_codegen_app(max_retries=2)
    tasks = live_codegen_tasks(16)
    config = pbkv.RuntimeConfig(engine="sim", check_integrity=True)
    async with pbkv.open_runtime(config) as rt:
        outcomes = await pbkv.serve_app(rt, app, tasks, concurrency=4)
        stats = rt.statistics()
    assert stats.leases == 0 and len(outcomes) == 16
    paths = {o.path for o in outcomes}
    for o in outcomes:
        retries = o.path.count("analyzer")
        assert o.path == ("planner", "coder") + ("analyzer", "coder") * retries
        assert o.reason == "end" or (o.reason == "recursion_limit" and retries == 2)
    assert len(paths) >= 2  # some pass first time, some retry


def shared_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("seed", [0, 1])
def test_with_a_shared_context_each_call_extends_the_conversation_but_its_role(seed):
    """Every agent's prompt is the preamble, the task, the turns so far, then its role as
    the closing user message: the next call, whichever agent makes it, reuses all of it
    but that role message and the opener. Role first, agents share the preamble only."""
    chat = smollm2_chat(8192)
    task = live_codegen_tasks(8)[6]  # is_palindrome: the hardest, so it often retries
    shared = simulate_workflow(
        live_codegen_app(max_retries=2, shared_context=True), task, chat, workflow_id="w", seed=seed
    )
    assert [s.agent for s in shared.steps][:2] == ["planner", "coder"]
    for before, after in itertools.pairwise(shared.steps):
        role = chat.encode(chat.render("user", ROLES[before.agent]))
        opener = chat.encode(chat.opener(before.agent.title()))
        unshared = len(role) + len(opener)
        prompt = before.prompt_token_ids
        assert prompt[len(prompt) - unshared :] == role + opener
        assert shared_prefix(prompt, after.prompt_token_ids) >= len(prompt) - unshared
    own = simulate_workflow(live_codegen_app(), task, chat, workflow_id="w", seed=seed)
    preamble = len(own.steps[0].segments[0].token_ids)
    planner, coder = own.steps[0].prompt_token_ids, own.steps[1].prompt_token_ids
    assert shared_prefix(planner, coder) < preamble + 16  # the preamble and "You are the "
