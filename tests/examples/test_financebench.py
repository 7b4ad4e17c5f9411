import statistics

import pytest

from pbkv.examples import FinanceBenchApp, decode, encode
from pbkv.examples.financebench import (
    COMPLEXITY_BONUS_TOKENS,
    EXCERPT_COMPLEXITY_TOKENS,
    EXCERPT_TOKENS,
    GAP_BEFORE_S,
    OUTPUT_TOKENS,
)
from pbkv.examples.financebench_prompts import QUESTION_TYPES

from . import checks


@pytest.fixture(scope="module")
def workflows():
    return FinanceBenchApp().generate(200, 0)


def test_path_is_always_the_same_sequential_crew(workflows):
    app = FinanceBenchApp()
    assert set(app.edges) == {
        ("researcher", "analyst"),
        ("analyst", "calculator"),
        ("calculator", "writer"),
        ("writer", "reviewer"),
        ("reviewer", "END"),
    }
    for w in workflows:
        assert w.agents == ("researcher", "analyst", "calculator", "writer", "reviewer")
        assert w.end_reason == "end"


def test_every_context_extends_the_previous_step(workflows):
    for w in workflows[:60]:
        for _, after, added in checks.context_additions(w):
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


def test_output_lengths_and_gaps_are_realistic(workflows):
    for w in workflows:
        assert w.steps[0].gap_s == 0.0
        for step in w.steps:
            low, high = OUTPUT_TOKENS[step.agent]
            assert low <= step.output_tokens <= high + COMPLEXITY_BONUS_TOKENS[step.agent]
            assert decode(step.output_token_ids).endswith("<|im_end|>\n")
            low, high = GAP_BEFORE_S.get(step.agent, (0.0, 0.0))
            assert low <= step.gap_s <= high
