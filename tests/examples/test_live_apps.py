"""The bundled apps run live on the sim engine exactly as their dry runs script them.

One definition serves both: ``serve_app`` drives each graph through workflow sessions
(routing on the simulated replies' text), and every request the engine receives must be
the dry run's step — same agent, same prompt ids, same output ids — with the same end
reason, under virtual time and with the KV manager's invariants checked every step.
"""

import pytest

import pbkv
from pbkv.examples import get_app
from pbkv.live import build_engine, serve_app

CASES = {  # (seed, workflow indices): a few each, with the capped ones included
    "codegen": (7, (0, 1)),  # 0 ends with recursion_limit
    "hover": (0, (0, 1, 2)),
    "swebench": (0, (1, 3)),  # 1 ends with recursion_limit
    "financebench": (0, (0, 1)),
    "groupchat": (0, (0, 1)),
    "taubench": (0, (0,)),
    "toolloop": (0, (0, 3)),  # 0 is deep (15 tool rounds), 3 quick; no dry run hits the cap
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_live_sim_run_issues_the_dry_run_requests(name, autojump_clock):
    seed, indices = CASES[name]
    app = get_app(name)
    scripts = app.generate(max(indices) + 1, seed)
    scripts = [scripts[i] for i in indices]
    config = pbkv.RuntimeConfig(engine="sim", policy="pbkv", check_integrity=True)
    built = build_engine(config)
    requests = {}
    generate = built.engine.generate

    async def recording(request):
        requests.setdefault(request.workflow_id, []).append(
            (request.agent, request.prompt_token_ids, request.scripted_output_token_ids)
        )
        return await generate(request)

    built.engine.generate = recording
    async with pbkv.open_runtime(config, built=built) as runtime:
        outcomes = await serve_app(
            runtime,
            app,
            [app.task(seed, i) for i in indices],
            concurrency=2,
            workflow_ids=[w.workflow_id for w in scripts],
            seed=seed,
        )
        assert runtime.statistics().leases == 0
    by_id = {o.workflow_id: o for o in outcomes}
    for script in scripts:
        expected = [(s.agent, s.prompt_token_ids, s.output_token_ids) for s in script.steps]
        assert requests[script.workflow_id] == expected
        outcome = by_id[script.workflow_id]
        assert (outcome.reason, outcome.path) == (script.end_reason, script.agents)
