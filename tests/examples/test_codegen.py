import pytest

from pbkv.examples import MAX_RETRIES, CodegenApp, failure_probability
from pbkv.examples.codegen import OUTPUT_TOKENS

from . import checks


@pytest.fixture(scope="module")
def workflows():
    return CodegenApp().generate(300, 0)


def retries(workflow):
    return workflow.agents.count("analyzer")


def test_end_reason_is_recursion_limit_exactly_at_the_cap(workflows):
    for w in workflows:
        capped = retries(w) == MAX_RETRIES and w.end_reason == "recursion_limit"
        assert capped or (w.end_reason == "end" and retries(w) <= MAX_RETRIES)
        assert len(w.steps) == 3 + 3 * retries(w)
    assert {w.end_reason for w in workflows} == {"end", "recursion_limit"}


def test_retries_rise_with_difficulty(workflows):
    easy, hard = checks.mean_by_difficulty(workflows, retries)
    assert easy < 0.5
    assert hard > easy + 1.0


def test_failure_probability_rises_with_difficulty_and_falls_per_retry():
    assert failure_probability(0.0, "Go", "web api", 0) == pytest.approx(0.08)
    assert failure_probability(1.0, "Go", "web api", 0) == pytest.approx(0.83)
    assert failure_probability(1.0, "Go", "web api", 2) == pytest.approx(0.69)
    assert failure_probability(1.0, "Rust", "concurrency", 0) == pytest.approx(0.95)
    assert failure_probability(0.0, "Python", "cli", 3) == pytest.approx(0.02)


def test_task_text_carries_noisy_cues_of_difficulty(workflows):
    hard = ("concurrency and race", "subtle edge cases", "strict performance", "corner cases")
    easy = ("simple change", "straightforward", "quick helper", "beginner-friendly")
    checks.assert_hard_cues_mark_harder_tasks(workflows, hard, easy, margin=0.3)


def test_output_lengths_and_gaps_are_realistic(workflows):
    for step in (s for w in workflows for s in w.steps):
        low, high = OUTPUT_TOKENS[step.agent]
        assert low <= step.output_tokens <= high + 250
        if step.agent == "analyzer":
            assert 1.0 <= step.gap_s <= 5.0
    assert all(w.steps[0].gap_s == 0.0 for w in workflows)
