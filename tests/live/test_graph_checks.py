"""What the graph API refuses, and how its runners report a broken app or a node's error.

A graph that cannot run is refused before any workflow opens; a declaration with a bad
field is refused where it is written; an error of the app's own code names the node;
and serve_app waits for the runtime's capacity rather than failing its workflows.
"""

import pytest

import pbkv
from pbkv import END, START


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
