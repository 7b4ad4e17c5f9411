import statistics

import pytest

from pbkv.examples import App, FinanceBenchApp, decode, encode, get_app, validate_path
from pbkv.examples.financebench import (
    AGENTS,
    COMPLEXITY_BONUS_TOKENS,
    EXCERPT_COMPLEXITY_TOKENS,
    EXCERPT_TOKENS,
    GAP_BEFORE_S,
    OUTPUT_TOKENS,
)
from pbkv.examples.financebench_prompts import QUESTION_TYPES


@pytest.fixture(scope="module")
def workflows():
    return FinanceBenchApp().generate(200, 0)


def test_registered_as_financebench():
    app = get_app("financebench")
    assert isinstance(app, FinanceBenchApp) and isinstance(app, App)
    assert app.generate(2, 5) == FinanceBenchApp().generate(2, 5)


def test_same_seed_same_workflows_and_prefix_stable():
    app = FinanceBenchApp()
    assert app.generate(8, 3) == app.generate(8, 3)
    assert app.generate(8, 3)[:5] == app.generate(5, 3)
    assert app.generate(8, 3) != app.generate(8, 4)


def test_ids_are_unique_and_named_by_seed(workflows):
    assert [w.workflow_id for w in workflows[:3]] == [
        "financebench-0-0",
        "financebench-0-1",
        "financebench-0-2",
    ]
    assert len({w.workflow_id for w in workflows}) == len(workflows)
    assert all(w.app == "financebench" for w in workflows)


def test_path_is_always_the_same_sequential_crew(workflows):
    app = FinanceBenchApp()
    assert app.edges == (
        ("researcher", "analyst"),
        ("analyst", "calculator"),
        ("calculator", "writer"),
        ("writer", "reviewer"),
        ("reviewer", "END"),
    )
    for w in workflows:
        validate_path(app, w.agents)
        assert w.agents == ("researcher", "analyst", "calculator", "writer", "reviewer")
        assert w.end_reason == "end"


def test_every_context_extends_the_previous_step(workflows):
    for w in workflows[:60]:
        for before, after in zip(w.steps, w.steps[1:], strict=False):
            context = before.segments[2].token_ids + before.output_token_ids
            assert after.segments[2].token_ids[: len(context)] == context
            added = decode(after.segments[2].token_ids[len(context) :])
            assert added == f"<|im_start|>assistant\n{after.agent.capitalize()}:\n"


def test_context_holds_the_question_then_a_long_10k_excerpt(workflows):
    opener = "<|im_start|>assistant\nResearcher:\n"
    for w in workflows:
        context = w.steps[0].segments[2].token_ids
        task = f"<|im_start|>user\n## Task\n{w.task_text}<|im_end|>\n"
        text = decode(context)
        assert text.startswith(f"{task}<|im_start|>user\n## Form 10-K excerpt: ")
        assert text.endswith(f"<|im_end|>\n{opener}")
        excerpt_tokens = len(context) - len(encode(task + opener)) - len(encode("<|im_end|>\n"))
        bonus = int(EXCERPT_COMPLEXITY_TOKENS * w.task_features["complexity"])
        assert EXCERPT_TOKENS[0] + bonus <= excerpt_tokens <= EXCERPT_TOKENS[1] + bonus
        assert 2000 <= excerpt_tokens <= 4000


def test_question_wording_is_the_cue_of_its_type(workflows):
    for w in workflows:
        kind = QUESTION_TYPES[w.task_features["question_type"]]
        question = w.task_text.split("Question: ", 1)[1]
        assert any(question.startswith(t.split("{company}")[0]) for t in kind.templates)
        assert f"fiscal {int(w.task_features['fiscal_year'])}" in question
        assert abs(w.task_features["complexity"] - kind.complexity) < 0.5
    assert {w.task_features["question_type"] for w in workflows} == set(QUESTION_TYPES)


def test_complexity_lengthens_the_outputs(workflows):
    def mean_output(question_type):
        return statistics.mean(
            sum(s.output_tokens for s in w.steps)
            for w in workflows
            if w.task_features["question_type"] == question_type
        )

    assert mean_output("lookup") + 200 < mean_output("adjusted")


def test_preamble_is_shared_and_roles_are_distinct(workflows):
    steps = [s for w in workflows for s in w.steps]
    assert [g.kind for g in steps[0].segments] == ["preamble", "role", "context"]
    assert len({s.segments[0].token_ids for s in steps}) == 1
    roles = {s.agent: s.segments[1].token_ids for s in steps}
    assert set(roles) == set(AGENTS)
    assert len(set(roles.values())) == len(AGENTS)
    assert 1000 <= len(steps[0].segments[0].token_ids) <= 2000
    assert all(300 <= len(r) <= 800 for r in roles.values())


def test_output_lengths_and_gaps_are_realistic(workflows):
    for w in workflows:
        assert w.steps[0].gap_s == 0.0
        for step in w.steps:
            low, high = OUTPUT_TOKENS[step.agent]
            assert low <= step.output_tokens <= high + COMPLEXITY_BONUS_TOKENS[step.agent]
            assert decode(step.output_token_ids).endswith("<|im_end|>\n")
            low, high = GAP_BEFORE_S.get(step.agent, (0.0, 0.0))
            assert low <= step.gap_s <= high


def test_negative_seed_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        FinanceBenchApp().generate(1, -1)
