"""The graph API (live/graph.py) and its executor (live/driver.py) on the live runtime."""

import importlib

import pytest
import trio
import trio.testing

import pbkv
from pbkv import END, START
from pbkv.live.chat import smollm2_chat
from pbkv.live.driver import simulate_workflow
from pbkv.live.graph import State


def sim(**fields):
    return pbkv.RuntimeConfig(engine="sim", check_integrity=True, **fields)


def verdict_app(passes_on_visit: int, *, cap: int | None = None) -> pbkv.App:
    """Coder → Tester, looping until the tester's reply holds PASS."""

    def tester_reply(state: State) -> pbkv.Simulated:
        visit = state.visits["tester"] + 1
        return pbkv.Simulated("PASS" if visit >= passes_on_visit else "FAIL", 12)

    app = pbkv.App("verdict", preamble="You are one of a team of engineers. " * 6)
    app.agent("coder", role="Write code.", simulate=lambda s: pbkv.Simulated("code", 30))
    app.agent("tester", role="Say PASS or FAIL.", simulate=tester_reply, max_visits=cap)
    app.edge(START, "coder").edge("coder", "tester")
    app.route("tester", lambda s, out: END if "PASS" in out.text else "coder", ["coder", END])
    return app


async def test_router_loops_until_the_reply_holds_the_marker(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, verdict_app(3), pbkv.LiveTask("t", "fizzbuzz"))
    assert outcome.reason == "end"
    assert outcome.path == ("coder", "tester") * 3
    # the shared preamble, then each call's own last prompt + output, is reused
    assert [r.cached_gpu_tokens > 0 for r in outcome.results] == [False] + [True] * 5
    coder = [r for a, r in zip(outcome.path, outcome.results, strict=True) if a == "coder"]
    assert all(
        b.cached_gpu_tokens >= a.prompt_tokens // 16 * 16
        for a, b in zip(coder, coder[1:], strict=False)
    )


async def test_a_retry_cap_ends_the_workflow_with_recursion_limit(autojump_clock):
    async with pbkv.open_runtime(sim()) as rt:
        capped = await pbkv.run_workflow(rt, verdict_app(99, cap=2), pbkv.LiveTask("t", "x"))
    assert capped.reason == "recursion_limit"
    assert capped.path == ("coder", "tester", "coder", "tester", "coder")


async def test_the_recursion_limit_counts_supersteps(autojump_clock):
    app = verdict_app(99)
    app.recursion_limit = 5
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, pbkv.LiveTask("t", "x"))
    assert outcome.reason == "recursion_limit"
    assert len(outcome.path) == 5


def fan_out_app() -> pbkv.App:
    async def search(state: State) -> str:
        await trio.sleep(1.0)
        return f"found {len(state.turns)}"

    app = pbkv.App("fan", preamble="Research team.")
    app.agent("planner", role="Split the question.", simulate=lambda s: pbkv.Simulated("3", 8))
    app.agent("reader", role="Answer.", simulate=lambda s: pbkv.Simulated("answer", 8))
    for i in range(3):
        app.tool(f"search{i}", search, simulate=lambda s: ("results", 1.0))
        app.edge(f"search{i}", "reader")
    app.edge(START, "planner")
    app.route(
        "planner",
        lambda s, out: ["search0", "search1", "search2"],
        ["search0", "search1", "search2"],
    )
    app.edge("reader", END)
    return app


def test_fan_out_runs_branches_concurrently_and_joins_them_once():
    app = fan_out_app()
    assert app.edges == (("planner", "reader"), ("reader", END))  # tools collapsed
    for engine in ("sim", "torch"):
        clock = trio.testing.MockClock(autojump_threshold=0) if engine == "sim" else None

        async def main(engine: str = engine) -> object:
            config = pbkv.RuntimeConfig(engine=engine, check_integrity=True, host_kv_tokens=0)
            async with pbkv.open_runtime(config) as rt:
                return await pbkv.run_workflow(rt, app, pbkv.LiveTask("t", "q"))

        outcome = trio.run(main, clock=clock)
        assert outcome.reason == "end"
        assert outcome.path == ("planner", "reader")  # the reader ran once, after all three
        tools_s = outcome.latency_s - sum(r.e2e_s for r in outcome.results)
        assert 1.0 <= tools_s < 2.0, f"{engine}: three 1 s tools took {tools_s:.2f} s in all"


async def test_a_router_that_raises_ends_its_workflow_with_error_and_others_go_on(autojump_clock):
    good = verdict_app(1)
    bad = verdict_app(1)

    def broken(state, out):
        raise RuntimeError("router bug")

    bad.routers.clear()
    bad.route("tester", broken, ["coder", END])
    async with pbkv.open_runtime(sim()) as rt:
        async with trio.open_nursery() as nursery:
            outcomes = {}

            async def run(name, app):
                outcomes[name] = await pbkv.run_workflow(rt, app, pbkv.LiveTask(name, "x"))

            for i in range(3):
                nursery.start_soon(run, f"good{i}", good)
            nursery.start_soon(run, "bad", bad)
        stats = rt.statistics()
    assert outcomes["bad"].reason == "error" and "router bug" in outcomes["bad"].error
    assert all(outcomes[f"good{i}"].reason == "end" for i in range(3))
    assert stats.ended_by_reason == {"end": 3, "error": 1} and stats.leases == 0


async def test_a_router_returning_an_undeclared_node_is_an_error(autojump_clock):
    app = verdict_app(1)
    app.routers.clear()
    app.route("tester", lambda s, out: "deployer", ["coder", END])
    async with pbkv.open_runtime(sim()) as rt:
        outcome = await pbkv.run_workflow(rt, app, pbkv.LiveTask("t", "x"))
    assert outcome.reason == "error" and "'deployer'" in outcome.error


async def test_cancelling_a_live_workflow_mid_prefill_leaves_no_lease_and_retires(autojump_clock):
    app = pbkv.App("long", preamble="p")
    app.agent("reader", role="Read.", simulate=lambda s: pbkv.Simulated("ok", 64))
    app.edge(START, "reader").edge("reader", END)
    async with pbkv.open_runtime(sim()) as rt:
        with trio.move_on_after(0.01):
            await pbkv.run_workflow(rt, app, pbkv.LiveTask("t", "word " * 3000), workflow_id="w")
        await trio.sleep(5)
        stats = rt.statistics()
        assert stats.ended_by_reason == {"aborted": 1}
        assert stats.leases == 0
        nodes = [n for n in rt.kv.tree.nodes() if n.accessors]
        assert all(n.retired for n in nodes if any(w == "w" for w, _ in n.accessors))
        rt.kv.check_integrity()


async def test_an_engine_step_that_raises_once_is_survived_by_every_workflow(autojump_clock):
    built = pbkv.live.build_engine(sim(max_batch_size=4))
    engine, calls = built.engine, {"n": 0}
    step = engine._step

    async def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA error: device-side assert")
        await step()

    engine._step = flaky_step
    tasks = [pbkv.LiveTask(f"t{i}", f"task {i}") for i in range(6)]
    async with pbkv.open_runtime(sim(), built=built) as rt:
        outcomes = await pbkv.serve_app(rt, verdict_app(2), tasks, concurrency=6)
        restarts = rt.system.statistics()["engine"].restarts
    assert restarts == 1
    assert sorted(o.reason for o in outcomes) == ["end"] * 6


def test_dry_run_walks_the_same_path_as_the_live_sim_run():
    app = verdict_app(2)
    task = pbkv.LiveTask("t", "fizzbuzz")
    script = simulate_workflow(app, task, smollm2_chat(32768), workflow_id="w")

    async def live():
        async with pbkv.open_runtime(sim()) as rt:
            return await pbkv.run_workflow(rt, app, task, workflow_id="w")

    outcome = trio.run(live, clock=trio.testing.MockClock(autojump_threshold=0))
    assert script.agents == outcome.path == ("coder", "tester", "coder", "tester")
    assert [s.prompt_tokens for s in script.steps] == [r.prompt_tokens for r in outcome.results]
    assert [s.output_token_ids for s in script.steps] == [
        r.output_token_ids for r in outcome.results
    ]


def test_declaring_a_bad_graph_names_the_node():
    app = pbkv.App("bad")
    with pytest.raises(ValueError, match="unknown node 'ghost'"):
        app.edge(START, "ghost")
    app.agent("a", role="r")
    with pytest.raises(ValueError, match="already declared"):
        app.agent("a", role="r")
    with pytest.raises(ValueError, match="reserved"):
        app.agent(END, role="r")
    app.edge(START, "a")
    with pytest.raises(ValueError, match="no outgoing edge"):
        app.validate()


@pytest.mark.parametrize("engine", ["sim", "torch"])
@pytest.mark.parametrize("module", ["quickstart_session", "quickstart_graph"])
def test_the_readme_examples_run(engine, module, capsys):
    quickstart = importlib.import_module(f"pbkv.examples.{module}")
    clock = trio.testing.MockClock(autojump_threshold=0) if engine == "sim" else None
    trio.run(quickstart.main, engine, clock=clock)
    out = capsys.readouterr().out
    assert ("cached" in out) if module == "quickstart_session" else ("GPU hit rate" in out)


def test_the_readme_shows_the_quickstarts_as_they_run():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    for name in ("quickstart_session", "quickstart_graph"):
        source = (root / "examples" / f"{name}.py").read_text()
        body = source[source.index("import sys") :]  # all but the docstring: it runs pasted
        assert f"```python\n{body}```" in readme, (
            f"README's copy of examples/{name}.py is out of date"
        )


async def test_an_agent_actor_that_fails_once_restarts_and_its_calls_are_retried(autojump_clock):
    tasks = [pbkv.LiveTask(f"t{i}", f"task {i}") for i in range(4)]
    async with pbkv.open_runtime(sim(max_batch_size=2)) as rt:
        async with trio.open_nursery() as nursery:
            outcomes = []

            async def serve():
                outcomes.extend(await pbkv.serve_app(rt, verdict_app(2), tasks, concurrency=4))

            nursery.start_soon(serve)
            await trio.sleep(0.5)  # coders are prefilling and queued
            rt.system.lookup("agent/coder").try_tell("not a message")  # the handler raises
        restarts = rt.system.statistics()["agent/coder"].restarts
        leases = rt.statistics().leases
    assert restarts == 1
    assert sorted(o.reason for o in outcomes) == ["end"] * 4
    assert leases == 0


async def test_a_call_that_can_never_fit_ends_its_workflow_without_a_retry(
    autojump_clock, tmp_path
):
    from pbkv.actors.events import AgentInvoked, LifecycleEvent
    from pbkv.runtime import EventRecorder, read_events

    app = pbkv.App("huge", preamble="p")
    app.agent("reader", role="Read.", simulate=lambda s: pbkv.Simulated("ok", 8), max_retries=3)
    app.edge(START, "reader").edge("reader", END)
    with EventRecorder(tmp_path / "events.jsonl") as recorder:
        async with pbkv.open_runtime(sim(gpu_kv_tokens=256), recorder=recorder) as rt:
            outcome = await pbkv.run_workflow(rt, app, pbkv.LiveTask("t", "word " * 600))
    assert outcome.reason == "error" and "tier holds" in outcome.error
    events = read_events(tmp_path / "events.jsonl", LifecycleEvent)
    assert sum(isinstance(e, AgentInvoked) for e in events) == 1  # not retried


def test_a_fan_out_app_generates_its_scripts_in_a_trio_run():
    # the dry run needs trio for the fan-out: generate starts over inside trio.run
    workflows = fan_out_app().generate(2, 0)
    assert [w.end_reason for w in workflows] == ["end", "end"]
    assert [s.agent for s in workflows[0].steps] == ["planner", "reader"]


def mapper_app() -> pbkv.App:
    """A fan-out whose branches draw their reply lengths from one shared stream."""
    mappers = [f"map{i}" for i in range(4)]
    app = pbkv.App("mapper", preamble="Map-reduce team.")
    app.agent("splitter", role="Split.", simulate=lambda s: pbkv.Simulated("split", 4))
    app.agent("reducer", role="Merge.", simulate=lambda s: pbkv.Simulated("merged", 8))
    for name in mappers:
        app.agent(
            name,
            role=f"Mapper {name}.",
            simulate=lambda s: pbkv.Simulated("mapped", int(s.rng("o").integers(4, 40))),
        )
        app.edge(name, "reducer")
    app.edge(START, "splitter")
    app.route("splitter", lambda s, out: ["map3", "map1", "map2"], mappers)
    app.edge("reducer", END)
    return app


def test_a_fan_out_dry_run_takes_the_branches_in_frontier_order_whatever_trios_state():
    import trio._core._run as trio_run

    scripts = []
    for prior in range(4):  # as other processes would find trio's shuffle seeded
        trio_run._r.seed(prior)
        [workflow] = mapper_app().generate(1, 0)
        scripts.append([(s.agent, s.output_tokens, s.gap_s) for s in workflow.steps])
    assert all(script == scripts[0] for script in scripts), scripts
    assert [agent for agent, _, _ in scripts[0]] == ["splitter", "map3", "map1", "map2", "reducer"]


def test_a_fan_out_app_runs_under_a_forecasting_policy():
    # its runs step between sibling branches, which no declared edge states: the
    # predictor's call graph admits what the app's own runs do
    from pbkv.bench.compare import BenchConfig, run_bench

    config = BenchConfig(
        app="tests.live.test_graph:mapper_app",
        workflows=8,
        concurrency=4,
        policies=("lru", "pbkv"),
        train_workflows=16,
    )
    results = run_bench(config, bounds=False).results
    assert [r.policy for r in results] == ["lru", "pbkv"]
    assert all(r.failed_workflows == 0 and r.workflows == 8 for r in results)


def test_a_sim_runtime_repeats_its_figures_whatever_trios_scheduling_state():
    """Concurrent workflows on the sim engine give one hit rate however trio's shuffle was
    seeded before (a fresh process seeds it from the OS): open_runtime seeds it."""
    import trio._core._run as trio_run

    from pbkv.examples import quickstart_graph

    async def hit_rate() -> float:
        tasks = [pbkv.LiveTask(f"task-{i}", f"Write fizzbuzz up to {10 * i}.") for i in range(6)]
        async with pbkv.open_runtime(sim(policy="pbkv")) as rt:
            await pbkv.serve_app(rt, quickstart_graph.app, tasks, concurrency=3)
            return rt.statistics().kv.gpu_hit_rate

    rates = []
    for prior in range(4):
        trio_run._r.seed(prior)  # as another process would find it
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = False
        rates.append(trio.run(hit_rate, clock=trio.testing.MockClock(autojump_threshold=0)))
    assert len(set(rates)) == 1, rates
