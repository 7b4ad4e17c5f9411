import statistics

import pytest

from pbkv.examples import MAX_RETRIES, CodegenApp, decode, failure_probability, validate_path
from pbkv.examples.codegen import AGENTS, OUTPUT_TOKENS


@pytest.fixture(scope="module")
def workflows():
    return CodegenApp().generate(300, 0)


def retries(workflow):
    return workflow.agents.count("analyzer")


def test_same_seed_same_workflows_and_prefix_stable():
    app = CodegenApp()
    assert app.generate(8, 3) == app.generate(8, 3)
    assert app.generate(8, 3)[:5] == app.generate(5, 3)
    assert app.generate(8, 3) != app.generate(8, 4)


def test_ids_are_unique_and_named_by_seed(workflows):
    assert [w.workflow_id for w in workflows[:3]] == ["codegen-0-0", "codegen-0-1", "codegen-0-2"]
    assert len({w.workflow_id for w in workflows}) == len(workflows)
    assert all(w.app == "codegen" for w in workflows)


def test_every_path_is_a_walk_of_the_call_graph(workflows):
    app = CodegenApp()
    for w in workflows:
        validate_path(app, w.agents)


def test_end_reason_is_recursion_limit_exactly_at_the_cap(workflows):
    for w in workflows:
        capped = retries(w) == MAX_RETRIES and w.end_reason == "recursion_limit"
        assert capped or (w.end_reason == "end" and retries(w) <= MAX_RETRIES)
        assert len(w.steps) == 3 + 3 * retries(w)
    assert {w.end_reason for w in workflows} == {"end", "recursion_limit"}


def test_retries_rise_with_difficulty(workflows):
    ranked = sorted(workflows, key=lambda w: w.task_features["difficulty"])
    third = len(ranked) // 3
    easy = statistics.mean(retries(w) for w in ranked[:third])
    hard = statistics.mean(retries(w) for w in ranked[-third:])
    assert easy < 0.5
    assert hard > easy + 1.0


def test_failure_probability_rises_with_difficulty_and_falls_per_retry():
    assert failure_probability(0.0, "Go", "web api", 0) == pytest.approx(0.08)
    assert failure_probability(1.0, "Go", "web api", 0) == pytest.approx(0.83)
    assert failure_probability(1.0, "Go", "web api", 2) == pytest.approx(0.69)
    assert failure_probability(1.0, "Rust", "concurrency", 0) == pytest.approx(0.95)
    assert failure_probability(0.0, "Python", "cli", 3) == pytest.approx(0.02)


def test_task_text_carries_noisy_cues_of_difficulty(workflows):
    def mean_difficulty(cue):
        hits = [w.task_features["difficulty"] for w in workflows if cue in w.task_text]
        return statistics.mean(hits)

    hard = ("concurrency and race", "subtle edge cases", "strict performance", "corner cases")
    easy = ("simple change", "straightforward", "quick helper", "beginner-friendly")
    assert min(mean_difficulty(c) for c in hard) > max(mean_difficulty(c) for c in easy) + 0.3


def test_previous_same_agent_prompt_and_output_prefix_the_next_prompt(workflows):
    for w in workflows[:60]:
        last = {}
        for step in w.steps:
            prompt = step.prompt_token_ids
            if step.agent in last:
                before = last[step.agent]
                assert prompt[: len(before.prompt_token_ids)] == before.prompt_token_ids
                full = before.prompt_token_ids + before.output_token_ids
                assert prompt[: len(full)] == full
            last[step.agent] = step


def test_preamble_is_shared_and_roles_are_distinct(workflows):
    steps = [s for w in workflows for s in w.steps]
    assert [g.kind for g in steps[0].segments] == ["preamble", "role", "context"]
    assert len({s.segments[0].token_ids for s in steps}) == 1
    roles = {s.agent: s.segments[1].token_ids for s in steps}
    assert set(roles) == set(AGENTS)
    assert len(set(roles.values())) == len(AGENTS)
    assert all(s.segments[1].token_ids == roles[s.agent] for s in steps)
    assert 1500 <= len(steps[0].segments[0].token_ids) <= 2500
    assert all(300 <= len(r) <= 800 for r in roles.values())


def test_context_starts_with_the_task_and_output_ends_the_turn(workflows):
    w = workflows[0]
    first = decode(w.steps[0].segments[2].token_ids)
    assert first.startswith(f"<|im_start|>user\n## Task\n{w.task_text}<|im_end|>")
    assert first.endswith("<|im_start|>assistant\nPlanner:\n")
    assert all(decode(s.output_token_ids).endswith("<|im_end|>\n") for s in w.steps)


def test_output_lengths_and_gaps_are_realistic(workflows):
    for step in (s for w in workflows for s in w.steps):
        low, high = OUTPUT_TOKENS[step.agent]
        assert low <= step.output_tokens <= high + 250
        if step.agent == "analyzer":
            assert 1.0 <= step.gap_s <= 5.0
    assert all(w.steps[0].gap_s == 0.0 for w in workflows)


def test_negative_seed_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        CodegenApp().generate(1, -1)
