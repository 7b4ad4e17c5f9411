"""What the graph API refuses, and how its runners report a broken app or a node's error.

A graph that cannot run is refused before any workflow opens; a declaration with a bad
field is refused where it is written; an error of the app's own code names the node;
and serve_app waits for the runtime's capacity rather than failing its workflows.
"""

import functools

import pytest
import trio
import trio.testing

import pbkv
from pbkv import END, START
from pbkv.live.chat import smollm2_chat
from pbkv.live.driver import NodeFailed, serve_replays, simulate_workflow
from pbkv.live.graph import State


def sim(**fields):
    return pbkv.RuntimeConfig(engine="sim", check_integrity=True, **fields)


def reply(text: str = "ok", tokens: int = 8):
    return lambda state: pbkv.Simulated(text, tokens)


def line_app(router=None, **tester) -> pbkv.App:
    """coder → tester → END (or ⇒ ``router`` → coder | END); ``tester`` overrides the
    tester's declaration."""
    app = pbkv.App("line", preamble="A small team.")
    app.agent("coder", role="Write code.", simulate=reply("code"))
    app.agent("tester", **{"role": "Say PASS.", "simulate": reply("PASS"), **tester})
    app.edge(START, "coder").edge("coder", "tester")
    if router is None:
        return app.edge("tester", END)
    return app.route("tester", router, ["coder", END])


def fan_out_app() -> pbkv.App:
    """planner ⇒ (left, right) → joiner → END: two calls at once per workflow."""
    app = pbkv.App("fan2", preamble="A research team.")
    for name in ("planner", "left", "right", "joiner"):
        app.agent(name, role=f"You are the {name}.", simulate=reply(name, 16))
    app.edge(START, "planner")
    app.route("planner", lambda s, out: ["left", "right"], ["left", "right"])
    app.edge("left", "joiner").edge("right", "joiner").edge("joiner", END)
    return app


TASK = pbkv.LiveTask("t", "fizzbuzz")


# -- 1. a broken graph is refused before anything runs ----------------------------------


def empty() -> pbkv.App:
    return pbkv.App("empty")


def no_start() -> pbkv.App:
    app = pbkv.App("no-start")
    app.agent("a", role="r").edge("a", END)
    return app


def start_to_end() -> pbkv.App:
    app = pbkv.App("start-end")
    return app.agent("a", role="r").edge("a", END).edge(START, END)


def dead_end() -> pbkv.App:
    app = pbkv.App("dead-end")
    app.agent("a", role="r").agent("b", role="r")
    return app.edge(START, "a").edge("a", "b")  # b has no way out


def entry_never_runs() -> pbkv.App:
    app = pbkv.App("capped-entry")
    return app.agent("a", role="r", max_visits=0).edge(START, "a").edge("a", END)


BROKEN = {
    empty: "app 'empty' declares no agents or tools",
    no_start: "app 'no-start' has no edge from START",
    start_to_end: "app 'start-end': START leads only to END",
    dead_end: "node 'b' has no outgoing edge",
    entry_never_runs: "node 'a' follows START but has max_visits=0",
}


@pytest.mark.parametrize("make", list(BROKEN), ids=lambda f: f.__name__)
async def test_a_broken_graph_is_refused_before_any_workflow_opens(make, autojump_clock):
    app, message = make(), BROKEN[make]
    async with pbkv.open_runtime(sim()) as rt:
        with pytest.raises(ValueError, match=message):
            await pbkv.run_workflow(rt, app, TASK)
        with pytest.raises(ValueError, match=message):
            await pbkv.serve_app(rt, app, [TASK, pbkv.LiveTask("u", "x")], concurrency=2)
        assert rt.statistics().workflows_started == 0
    with pytest.raises(ValueError, match=message):
        simulate_workflow(app, TASK, smollm2_chat(32768), workflow_id="w")
    with pytest.raises(ValueError, match=message):
        app.generate(2, 0)


async def test_serve_app_validates_the_graph_once_not_per_workflow(autojump_clock):
    app = line_app()
    calls = []
    validate = app.validate
    app.validate = lambda: (calls.append(1), validate())[1]
    tasks = [pbkv.LiveTask(f"t{i}", "x") for i in range(5)]
    async with pbkv.open_runtime(sim()) as rt:
        outcomes = await pbkv.serve_app(rt, app, tasks, concurrency=2)
    assert [o.reason for o in outcomes] == ["end"] * 5
    assert len(calls) == 1


# -- 2. serve_app waits for the runtime's capacity --------------------------------------


async def test_serve_app_waits_for_capacity_rather_than_failing_a_fan_out(autojump_clock):
    # admission limit: batch 2 + queue 1 = 3 calls; 6 workflows of two branches want 12
    tasks = [pbkv.LiveTask(f"t{i}", f"task {i}") for i in range(6)]
    async with pbkv.open_runtime(sim(max_batch_size=2, max_queued_requests=1)) as rt:
        assert rt.max_calls_in_flight == 3
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, rt.statistics().calls_in_flight)
                await trio.sleep(0.001)

        with trio.fail_after(600):  # virtual seconds: a deadlock would hit it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                outcomes = await pbkv.serve_app(rt, fan_out_app(), tasks, concurrency=6)
                nursery.cancel_scope.cancel()
        stats = rt.statistics()
    assert [o.error for o in outcomes if o.error] == []
    assert sorted(o.reason for o in outcomes) == ["end"] * 6
    assert all(len(o.path) == 4 for o in outcomes)
    assert peak == 3 and stats.calls_in_flight == 0 and stats.leases == 0


async def test_graph_calls_wait_while_calls_from_outside_fill_the_runtime(autojump_clock):
    long = [{"role": "user", "content": "word " * 3000}]  # a prefill of seconds
    tasks = [pbkv.LiveTask(f"t{i}", f"task {i}") for i in range(2)]
    config = sim(max_batch_size=2, max_queued_requests=0)
    async with (
        pbkv.open_runtime(config) as rt,
        rt.workflow() as wf,
        trio.open_nursery() as nursery,
    ):
        for i in range(2):
            nursery.start_soon(functools.partial(wf.call, f"bare{i}", long, max_new_tokens=4))
        await trio.testing.wait_all_tasks_blocked()
        assert rt.statistics().calls_in_flight == 2  # the runtime is full
        with trio.fail_after(600):
            outcomes = await pbkv.serve_app(rt, fan_out_app(), tasks, concurrency=2)
    assert sorted(o.reason for o in outcomes) == ["end"] * 2


@pytest.fixture
def fan_out_scripts():
    return fan_out_app().generate(6, 0)  # outside trio: a fan-out's dry run starts one


async def test_replays_wait_for_capacity_too(fan_out_scripts, autojump_clock):
    scripts = fan_out_scripts
    async with pbkv.open_runtime(sim(max_batch_size=1, max_queued_requests=1)) as rt:
        with trio.fail_after(600):
            outcomes = await serve_replays(rt, scripts, concurrency=6)
    assert sorted(o.reason for o in outcomes) == ["end"] * 6


# -- 3. workflow ids are checked up front -----------------------------------------------


async def test_serve_app_refuses_duplicate_or_open_workflow_ids_before_running(autojump_clock):
    app = line_app()
    two = [TASK, pbkv.LiveTask("u", "y")]
    async with pbkv.open_runtime(sim()) as rt:
        with pytest.raises(ValueError, match="unique; 'same' is given 2 times"):
            await pbkv.serve_app(rt, app, two, workflow_ids=["same", "same"], concurrency=2)
        with pytest.raises(ValueError, match="non-empty strings, got ''"):
            await pbkv.serve_app(rt, app, two, workflow_ids=["a", ""], concurrency=2)
        assert rt.statistics().workflows_started == 0
        async with rt.workflow("busy"):
            with pytest.raises(ValueError, match="'busy' is already open"):
                await pbkv.serve_app(rt, app, two, workflow_ids=["ok", "busy"])
        assert rt.statistics().workflows_started == 1


# -- 4. declarations are checked where they are written ---------------------------------


def declare(**agent):
    app = pbkv.App("decl")
    return app.agent("a", **{"role": "r", **agent})


REFUSED = [
    (lambda: declare(max_retries=-1), ValueError, "agent 'a': max_retries must be >= 0"),
    (lambda: declare(max_retries=1.5), TypeError, "agent 'a': max_retries must be an int"),
    (lambda: declare(max_visits=-1), ValueError, "agent 'a': max_visits must be >= 0"),
    (lambda: declare(max_visits=True), TypeError, "agent 'a': max_visits must be an int"),
    (lambda: declare(max_new_tokens=0), ValueError, "agent 'a': max_new_tokens must be >= 1"),
    (lambda: declare(max_new_tokens=2.5), TypeError, "agent 'a': max_new_tokens must be an"),
    (lambda: declare(role=None), TypeError, "agent 'a': role must be a str"),
    (lambda: declare(prompt="hello"), TypeError, "agent 'a': prompt must be callable"),
    (lambda: declare(simulate="PASS"), TypeError, "agent 'a': simulate must be callable"),
    (lambda: declare(sampling=0.7), TypeError, "agent 'a': sampling must be a pbkv.Sampling"),
    (lambda: pbkv.App("x", recursion_limit=1.5), TypeError, "recursion_limit must be an int"),
    (lambda: pbkv.App("x", recursion_limit=0), ValueError, "recursion_limit must be >= 1"),
    (lambda: declare().tool("t", "run"), TypeError, "tool 't': run must be callable"),
    (lambda: declare().tool("t", len, max_visits=-2), ValueError, "tool 't': max_visits"),
    (
        lambda: declare().route("a", lambda s, o: END, targets="a"),
        TypeError,
        r"router of 'a': targets must be a sequence of node names, got str 'a'; write \['a'\]",
    ),
    (lambda: declare().route("a", "a", ["a"]), TypeError, "router of 'a': router must be"),
    (lambda: declare().edge("a", ["a"]), TypeError, r"edge ends must be node names"),
]


@pytest.mark.parametrize(("make", "error", "message"), REFUSED)
def test_a_bad_declaration_is_refused_naming_the_node_and_field(make, error, message):
    with pytest.raises(error, match=message):
        make()


async def test_max_visits_zero_ends_the_workflow_when_the_node_is_reached(autojump_clock):
    app = line_app(max_visits=0)  # as live_codegen's analyzer with --max-retries 0
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, TASK)
    assert (outcome.reason, outcome.path) == ("recursion_limit", ("coder",))


@pytest.mark.parametrize("engine", ["sim", "dry"])
async def test_a_plain_function_serves_as_a_tool(engine, autojump_clock):
    def count_files(state: State) -> str:  # not async
        return f"{len(state.turns)} files"

    app = pbkv.App("sync-tool", preamble="p")
    app.agent("coder", role="Write.", simulate=reply("code"))
    app.tool("ls", count_files)
    app.agent("reader", role="Read.", simulate=reply("done"))
    app.edge(START, "coder").edge("coder", "ls")
    app.route("ls", lambda s, out: "reader" if out.text == "1 files" else END, ["reader", END])
    app.edge("reader", END)
    if engine == "dry":
        script = simulate_workflow(app, TASK, smollm2_chat(32768), workflow_id="w")
        assert (script.end_reason, script.agents) == ("end", ("coder", "reader"))
        return
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, TASK)
    assert (outcome.reason, outcome.error, outcome.path) == ("end", "", ("coder", "reader"))


# -- 5. a node's error names the node ---------------------------------------------------


def boom(*args):
    return 1 / 0


def with_tool(**tool) -> pbkv.App:
    app = pbkv.App("tooled", preamble="p")
    app.agent("coder", role="Write.", simulate=reply("code"))
    app.tool("search", **{"run": boom, **tool})
    app.edge(START, "coder").edge("coder", "search").edge("search", END)
    return app


ZERO = "ZeroDivisionError: division by zero"
FAILING = {
    "router raises": (line_app(boom), f"node 'tester' (router) raised {ZERO}"),
    "router returns None": (
        line_app(lambda s, out: None),
        "TypeError: router of 'tester' returned None; expected a node name, END, or a "
        "non-empty sequence of them",
    ),
    "router returns []": (line_app(lambda s, out: []), "router of 'tester' returned []"),
    "router returns a number": (line_app(lambda s, out: [1]), "router of 'tester' returned [1]"),
    "tool raises": (with_tool(), f"node 'search' (tool) raised {ZERO}"),
    "tool's simulate raises": (with_tool(simulate=boom), f"node 'search' (simulate) raised {ZERO}"),
    "tool's simulate returns text": (
        with_tool(simulate=lambda s: "results"),
        "simulate of tool 'search' returned 'results'; expected (text, latency_s)",
    ),
    "tool returns a number": (
        with_tool(run=lambda s: 3),
        "tool 'search' returned int; expected a str",
    ),
    "agent's simulate raises": (line_app(simulate=boom), f"node 'tester' (simulate) raised {ZERO}"),
    "agent's simulate returns text": (
        line_app(simulate=lambda s: "PASS"),
        "simulate of agent 'tester' returned str; expected a pbkv.Simulated",
    ),
    "prompt builder raises": (
        line_app(prompt=boom),
        f"node 'tester' (prompt builder) raised {ZERO}",
    ),
    "prompt builder returns a string": (
        line_app(prompt=lambda s: "Review the code."),
        "prompt builder of agent 'tester' returned str; expected a list of",
    ),
}


@pytest.mark.parametrize("case", list(FAILING))
async def test_a_nodes_error_names_the_node_and_what_it_was_doing(case, autojump_clock):
    app, message = FAILING[case]
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, TASK)
        stats = rt.statistics()
    assert outcome.reason == "error"
    assert message in outcome.error
    assert stats.ended_by_reason == {"error": 1} and stats.leases == 0


def test_a_nodes_error_keeps_the_original_chained():
    assert pbkv.live.NodeFailed is NodeFailed
    with pytest.raises(NodeFailed, match=r"node 'tester' \(router\)") as caught:
        simulate_workflow(line_app(boom), TASK, smollm2_chat(32768), workflow_id="w")
    assert caught.value.node == "tester" and caught.value.part == "router"
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


async def test_a_failing_fan_out_branch_is_named_not_grouped(autojump_clock):
    app = pbkv.App("fan-fail", preamble="p")
    app.agent("planner", role="Split.", simulate=reply("2"))
    app.agent("reader", role="Read.", simulate=reply("ok"))
    app.tool("good", lambda s: "found", simulate=lambda s: ("found", 5.0))
    app.tool("bad", boom, simulate=boom)
    app.route("planner", lambda s, out: ["good", "bad"], ["good", "bad"])
    app.edge(START, "planner").edge("good", "reader").edge("bad", "reader").edge("reader", END)
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, TASK)
    assert outcome.error == f"node 'bad' (simulate) raised {ZERO}"
    assert outcome.end_s - outcome.start_s < 5.0  # the other branch was cancelled


# -- 6. a prompt builder's messages pass wf.call's own check ----------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"role": "wizard", "content": "x"},
        {"role": "user", "content": 5},
        {"role": "user", "content": [{"type": "image_url"}]},
        "not a mapping",
    ],
    ids=["role", "content", "part", "mapping"],
)
async def test_a_prompt_builders_bad_message_is_refused_as_wf_call_refuses_it(
    message, autojump_clock
):
    app = line_app(prompt=lambda s: [{"role": "user", "content": "ok"}, message])
    async with pbkv.open_runtime(sim()) as rt:
        async with rt.workflow() as wf:
            with pytest.raises((TypeError, ValueError)) as refused:
                await wf.call("a", [{"role": "user", "content": "ok"}, message])
        outcome = await pbkv.run_workflow(rt, app, TASK)
    assert outcome.reason == "error"
    assert f"prompt builder of agent 'tester': {refused.value}" in outcome.error
    assert "messages[1]" in outcome.error


async def test_a_message_without_content_is_empty_text_for_wf_call_and_builders(autojump_clock):
    app = line_app(prompt=lambda s: [{"role": "user", "content": "ok"}, {"role": "assistant"}])
    async with pbkv.open_runtime(sim()) as rt:
        async with rt.workflow() as wf:
            await wf.call("a", [{"role": "user", "content": "ok"}, {"role": "assistant"}])
        outcome = await pbkv.run_workflow(rt, app, TASK)
    assert (outcome.reason, outcome.error) == ("end", "")
