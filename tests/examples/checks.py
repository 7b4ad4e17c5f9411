"""Properties that several bundled apps share, as plain functions that assert them."""

import statistics
from collections.abc import Callable, Iterator, Sequence

from pbkv.actors.workload import Step, Workflow
from pbkv.examples import App, decode
from pbkv.live import LiveTask, State, simulate_workflow
from pbkv.live.build import SIM_CONTEXT_TOKENS
from pbkv.live.chat import smollm2_chat


def run_with_route(monkeypatch, app, task: LiveTask, route_rng) -> Workflow:
    """Dry-run ``app`` on ``task`` with ``route_rng`` standing in for its ``route`` stream."""
    rng = State.rng
    monkeypatch.setattr(
        State, "rng", lambda state, stream: route_rng if stream == "route" else rng(state, stream)
    )
    return simulate_workflow(app, task, smollm2_chat(SIM_CONTEXT_TOKENS), workflow_id="w")


def assert_deterministic(app: App) -> None:
    """Assert that a seed fixes the workflows, a prefix of them included, and seeds differ."""
    assert app.generate(8, 3) == app.generate(8, 3)
    assert app.generate(8, 3)[:5] == app.generate(5, 3)
    assert app.generate(8, 3) != app.generate(8, 4)


def assert_ids_named_by_seed(workflows: Sequence[Workflow], name: str, seed: int) -> None:
    """Assert that workflow ``i`` of ``seed`` is ``f"{name}-{seed}-{i}"`` of app ``name``."""
    assert [w.workflow_id for w in workflows] == [
        f"{name}-{seed}-{i}" for i in range(len(workflows))
    ]
    assert all(w.app == name for w in workflows)


def assert_same_agent_prompts_extend(workflows: Sequence[Workflow]) -> None:
    """Assert that each step's prompt plus output prefixes the same agent's next prompt."""
    for w in workflows:
        last: dict[str, Step] = {}
        for step in w.steps:
            if step.agent in last:
                before = last[step.agent]
                full = before.prompt_token_ids + before.output_token_ids
                assert step.prompt_token_ids[: len(full)] == full
            last[step.agent] = step


def assert_preamble_shared_and_roles_distinct(
    workflows: Sequence[Workflow],
    agents: Sequence[str],
    preamble_tokens: tuple[int, int],
    role_tokens: tuple[int, int] = (300, 800),
) -> None:
    """Assert one preamble for all steps and one distinct role per agent, sized in bounds."""
    steps = [s for w in workflows for s in w.steps]
    assert [g.kind for g in steps[0].segments] == ["preamble", "role", "context"]
    assert len({s.segments[0].token_ids for s in steps}) == 1
    roles = {s.agent: s.segments[1].token_ids for s in steps}
    assert set(roles) == set(agents)
    assert len(set(roles.values())) == len(agents)
    assert all(s.segments[1].token_ids == roles[s.agent] for s in steps)
    assert preamble_tokens[0] <= len(steps[0].segments[0].token_ids) <= preamble_tokens[1]
    assert all(role_tokens[0] <= len(r) <= role_tokens[1] for r in roles.values())


def assert_opens_with_task_and_turns_end(workflow: Workflow, heading: str, speaker: str) -> None:
    """Assert that the first context is the task under ``heading``, then ``speaker``'s opener,
    and that every output ends the turn."""
    first = decode(workflow.steps[0].segments[2].token_ids)
    assert first.startswith(f"<|im_start|>user\n## {heading}\n{workflow.task_text}<|im_end|>")
    assert first.endswith(f"<|im_start|>assistant\n{speaker}:\n")
    assert all(decode(s.output_token_ids).endswith("<|im_end|>\n") for s in workflow.steps)


def context_additions(workflow: Workflow) -> Iterator[tuple[Step, Step, str]]:
    """Yield each pair of consecutive steps and the text the later context adds.

    Asserts on the way that each context extends the previous step's context and output.
    """
    for before, after in zip(workflow.steps, workflow.steps[1:], strict=False):
        context = before.segments[2].token_ids + before.output_token_ids
        assert after.segments[2].token_ids[: len(context)] == context
        yield before, after, decode(after.segments[2].token_ids[len(context) :])


def mean_by_difficulty(
    workflows: Sequence[Workflow], measure: Callable[[Workflow], float]
) -> tuple[float, float]:
    """Return the mean of ``measure`` over the easiest and the hardest third of ``workflows``."""
    ranked = sorted(workflows, key=lambda w: w.task_features["difficulty"])
    third = len(ranked) // 3
    easy = statistics.mean(measure(w) for w in ranked[:third])
    hard = statistics.mean(measure(w) for w in ranked[-third:])
    return easy, hard


def assert_hard_cues_mark_harder_tasks(
    workflows: Sequence[Workflow], hard: Sequence[str], easy: Sequence[str], margin: float
) -> None:
    """Assert that each ``hard`` cue's tasks are harder on average, by ``margin``, than any
    ``easy`` cue's."""

    def mean_difficulty(cue: str) -> float:
        return statistics.mean(
            w.task_features["difficulty"] for w in workflows if cue in w.task_text
        )

    assert min(mean_difficulty(c) for c in hard) > max(mean_difficulty(c) for c in easy) + margin
