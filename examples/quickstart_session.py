"""Quickstart: a session calling two agents: ``python -m pbkv.examples.quickstart_session``."""

import sys

import pbkv


async def main(engine: str, model: str | None = None) -> None:
    async with pbkv.open_runtime(
        engine=engine, model=model, policy="pbkv", check_integrity=True
    ) as rt:
        async with rt.workflow(task_text="Plan a 3-day trip to Rome.") as wf:
            system = {"role": "system", "content": "You are a travel agency's team."}
            ask = {"role": "user", "content": "Plan a 3-day trip to Rome."}
            plan = await wf.call("planner", [system, ask], max_new_tokens=32)
            critique = {"role": "user", "content": "Critique the plan in one line."}
            history = [system, ask, {"role": "assistant", "content": plan.text}, critique]
            review = await wf.call("critic", history, max_new_tokens=32)
        print(f"planner: {plan.text!r}\ncritic: {review.text!r}")
        print(f"critic's prompt: {review.prompt_tokens} tokens, {review.cached_tokens} cached")


if __name__ == "__main__":  # engine: torch (default) or sim; torch model: tiny, smollm2, a folder
    pbkv.run(main, *sys.argv[1:])
