from typing import NamedTuple

import pytest

from pbkv.examples import (
    App,
    CodegenApp,
    FinanceBenchApp,
    GroupChatApp,
    HoverApp,
    SwebenchApp,
    TauBenchApp,
    ToolLoopApp,
    app_names,
    get_app,
    register_app,
    validate_path,
)
from pbkv.examples.groupchat import MAX_ROUNDS
from pbkv.examples.sampling import spawn_rngs
from pbkv.live import START, LiveTask, Simulated
from pbkv.live import App as LiveApp
from pbkv.predictor.trace import END

from . import checks

APPS = {
    "codegen": CodegenApp,
    "financebench": FinanceBenchApp,
    "groupchat": GroupChatApp,
    "hover": HoverApp,
    "swebench": SwebenchApp,
    "taubench": TauBenchApp,
    "toolloop": ToolLoopApp,
}


class PromptLayout(NamedTuple):
    """How a generated app's prompts start: preamble size, task heading, first speaker."""

    preamble_tokens: tuple[int, int]
    task_heading: str
    first_speaker: str
    role_tokens: tuple[int, int] = (300, 800)


LAYOUTS = {
    "codegen": PromptLayout((1500, 2500), "Task", "Planner"),
    "financebench": PromptLayout((1000, 2000), "Task", "Researcher"),
    "groupchat": PromptLayout((600, 1500), "Request", "Selector", (30, 120)),
    "hover": PromptLayout((1000, 2000), "Task", "Decomposer"),
    "swebench": PromptLayout((1000, 2000), "Issue", "Manager"),
    "toolloop": PromptLayout((1000, 2000), "Ticket", "Assistant"),
}
GENERATED = tuple(LAYOUTS)
"""The apps that draw their workflows (taubench replays recorded ones)."""


@pytest.fixture(scope="module", params=tuple(APPS))
def sample(request):
    """Return an app's name and 200 of its workflows (seed 0), one app at a time."""
    return request.param, get_app(request.param).generate(200, 0)


def test_registry_knows_the_bundled_apps():
    assert set(APPS) <= set(app_names())


@pytest.mark.parametrize("name", tuple(APPS))
def test_each_app_is_registered_by_name(name):
    app = get_app(name)
    assert isinstance(app, APPS[name]) and isinstance(app, App)
    assert app.name == name
    assert app.generate(2, 5) == APPS[name]().generate(2, 5)


def test_unknown_app_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown app 'nope'; known apps: .*codegen.*taubench"):
        get_app("nope")


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_app("codegen", lambda: get_app("codegen"))


def test_validate_path_accepts_a_walk_and_names_a_bad_transition():
    app = get_app("codegen")
    validate_path(app, ("planner", "coder", "tester", "analyzer", "coder", "tester"))
    with pytest.raises(ValueError, match=r"step 1: transition 'coder' -> 'analyzer'"):
        validate_path(app, ("planner", "coder", "analyzer"))
    with pytest.raises(ValueError, match="not an entry agent"):
        validate_path(app, ("coder", "tester"))
    with pytest.raises(ValueError, match=r"step 1: transition 'coder' -> 'END'"):
        validate_path(app, ("planner", "coder"))
    with pytest.raises(ValueError, match="at least one agent"):
        validate_path(app, ())


@pytest.mark.parametrize("name", tuple(APPS))
@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_generate_rejects_a_bad_count(name, bad):
    with pytest.raises(ValueError, match="n_workflows"):
        get_app(name).generate(bad, 0)


@pytest.mark.parametrize("name", GENERATED)
def test_negative_seed_is_rejected(name):
    with pytest.raises(ValueError, match="seed"):
        get_app(name).generate(1, -1)


@pytest.mark.parametrize("name", tuple(APPS))
def test_same_seed_same_workflows_and_prefix_stable(name):
    checks.assert_deterministic(get_app(name))


def test_ids_are_unique_and_named_by_seed(sample):
    name, workflows = sample
    checks.assert_ids_named_by_seed(workflows, name, seed=0)


def test_every_path_is_a_walk_of_the_call_graph(sample):
    name, workflows = sample
    app = get_app(name)
    for w in workflows:
        validate_path(app, w.agents)


def test_previous_same_agent_prompt_and_output_prefix_the_next_prompt(sample):
    _, workflows = sample
    checks.assert_same_agent_prompts_extend(workflows)


@pytest.mark.parametrize("sample", GENERATED, indirect=True)
def test_preamble_is_shared_and_roles_are_distinct(sample):
    name, workflows = sample
    agents = get_app(name).agents
    checks.assert_preamble_shared_and_roles_distinct(
        workflows, agents, LAYOUTS[name].preamble_tokens, LAYOUTS[name].role_tokens
    )


@pytest.mark.parametrize("sample", GENERATED, indirect=True)
def test_context_starts_with_the_task_and_outputs_end_the_turn(sample):
    name, workflows = sample
    layout = LAYOUTS[name]
    for w in workflows[:20]:
        checks.assert_opens_with_task_and_turns_end(w, layout.task_heading, layout.first_speaker)


def toy_app() -> LiveApp:
    """One agent that answers once; its output is one id drawn from its ``output`` stream."""

    def reply(state):
        return Simulated(token_ids=(int(state.rng("output").integers(100)),))

    app = LiveApp("toy").agent("solver", role="Solve.", simulate=reply).edge(START, "solver")
    app.edge("solver", END)
    return app.tasks(
        lambda seed, i: LiveTask(
            f"{seed}-{i}", f"task {seed}-{i}", {"size": 1.0}, (seed, i), ("task", "route", "output")
        )
    )


def test_graph_app_draws_each_workflow_from_its_seed_and_index():
    workflows = toy_app().generate(2, 7)
    assert [w.workflow_id for w in workflows] == ["toy-7-0", "toy-7-1"]
    assert [w.task_text for w in workflows] == ["task 7-0", "task 7-1"]
    assert all(w.task_features == {"size": 1.0} and w.end_reason == "end" for w in workflows)
    outputs = [w.steps[0].output_token_ids for w in workflows]
    assert outputs == [(int(spawn_rngs(7, i, 3)[2].integers(100)),) for i in (0, 1)]
    assert isinstance(toy_app(), App)


def test_graph_app_without_a_task_source_gets_default_tasks():
    app = LiveApp("bare").agent("solver", role="Solve.").edge(START, "solver").edge("solver", END)
    (workflow,) = app.generate(1, 3)
    assert (workflow.task_id, workflow.task_text) == ("3-0", "Task 0 of workload 3.")
    assert workflow.agents == ("solver",) and workflow.end_reason == "end"
    with pytest.raises(TypeError, match="not LiveTask"):
        app.tasks(lambda seed, i: "a task").generate(1, 0)


def test_load_app_takes_a_graph_or_a_factory_from_a_module(tmp_path, monkeypatch):
    (tmp_path / "user_toy.py").write_text(
        "import pbkv.live as live\n"
        "def make():\n"
        "    app = live.App('toy-user').agent('solver', role='Solve.')\n"
        "    return app.edge(live.START, 'solver').edge('solver', live.END)\n"
        "app = make()\n"
        "broken = live.App('broken').agent('solver', role='Solve.')\n"
        "number = 42\n"
        "class Raw:  # an app class whose class attributes alone look like an app\n"
        "    name, agents, entry_agents = 'raw-user', ('solver',), ('solver',)\n"
        "    edges = (('solver', live.END),)\n"
        "    def generate(self, n_workflows, seed):\n"
        "        return make().generate(n_workflows, seed)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("user_toy:app", "user_toy:make"):
        app = get_app(spec)
        assert (app.name, app.agents, app.edges) == ("toy-user", ("solver",), (("solver", END),))
        assert [w.agents for w in app.generate(2, 0)] == [("solver",), ("solver",)]
    raw = get_app("user_toy:Raw")  # instantiated: generate needs its self
    assert raw.name == "raw-user" and [w.agents for w in raw.generate(1, 0)] == [("solver",)]
    for spec, message in (
        ("user_toy", "unknown app"),
        ("user_toy:", "expected 'module:attribute'"),
        ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
        ("user_toy:nope", "has no attribute 'nope'"),
        ("user_toy:number", "is a int, not an app"),
        ("user_toy:broken", "no edge from START"),
    ):
        with pytest.raises(ValueError, match=message):
            get_app(spec)


def test_a_capped_node_lets_the_agent_before_it_end_the_workflow():
    app = LiveApp("capped").agent("a", role="A.").agent("b", role="B.", max_visits=2)
    app.edge(START, "a").edge("a", "b").edge("b", "a")
    assert set(app.edges) == {("a", "b"), ("a", END), ("b", "a")}
    assert app.entry_agents == ("a",)
    (workflow,) = app.generate(1, 0)
    assert (workflow.agents, workflow.end_reason) == (("a", "b") * 2 + ("a",), "recursion_limit")
    validate_path(app, workflow.agents)


def test_groupchat_selector_keeps_naming_the_favourite_and_alternates_with_it():
    workflows = get_app("groupchat").generate(60, 0)
    shares = []
    for wf in workflows:
        agents = [s.agent for s in wf.steps]
        members = agents[1::2]
        assert agents[0] == "selector"
        assert agents[-1] == "selector" or len(members) == MAX_ROUNDS  # TERMINATE, or the cap
        assert agents[::2] == ["selector"] * len(agents[::2])  # selector, member, selector...
        favourite = wf.task_features["favourite"]
        shares.append(members.count(favourite) / len(members))
    assert sum(shares) / len(shares) > 0.7  # stickiness is drawn in [0.6, 0.95]
    assert min(len(wf.steps) for wf in workflows) >= 7  # MIN_ROUNDS member turns at least
