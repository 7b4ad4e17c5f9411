"""Quickstart: a 3-agent app with a retry loop (``python -m pbkv.examples.quickstart_graph``)."""

import sys

import pbkv
from pbkv import END, START

app = pbkv.App("quickstart", preamble="You are part of a small software team.")
app.agent(
    "planner",
    role="Plan the work in three short steps.",
    max_new_tokens=24,
    simulate=lambda s: pbkv.Simulated("1. parse 2. solve 3. test", output_tokens=60),
)
app.agent(
    "coder",
    role="Write the code for the plan.",
    max_new_tokens=32,
    simulate=lambda s: pbkv.Simulated("def solve(): ...", output_tokens=120),
)
app.agent(
    "tester",
    role="Review the code. Answer PASS or FAIL first.",
    max_new_tokens=8,
    max_visits=3,  # the retry cap: a 4th test ends the workflow with recursion_limit
    simulate=lambda s: pbkv.Simulated("PASS" if s.rng("t").random() < 0.6 else "FAIL"),
)
app.edge(START, "planner").edge("planner", "coder").edge("coder", "tester")
app.route(
    "tester", lambda state, reply: END if "PASS" in reply.text else "coder", targets=["coder", END]
)


async def main(engine: str, model: str | None = None) -> None:
    tasks = [pbkv.LiveTask(f"task-{i}", f"Write fizzbuzz up to {10 * i}.") for i in range(1, 5)]
    async with pbkv.open_runtime(
        engine=engine, model=model, policy="pbkv", check_integrity=True
    ) as rt:
        outcomes = await pbkv.serve_app(rt, app, tasks, concurrency=2)
        hit = rt.statistics().kv.gpu_hit_rate
    for o in sorted(outcomes, key=lambda o: o.workflow_id):
        print(f"{o.workflow_id}: {o.reason:15} {' > '.join(o.path)}")
    print(f"GPU hit rate {hit:.1%}")


if __name__ == "__main__":  # engine: torch (default) or sim; torch model: tiny, smollm2, a folder
    pbkv.run(main, *sys.argv[1:])
