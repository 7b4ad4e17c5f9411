import re
import statistics

import pytest

from pbkv.examples import MAX_CODER_TURNS, SwebenchApp, decode, swebench
from pbkv.examples import swebench_prompts as text
from pbkv.examples.swebench import (
    DIFFICULTY_BONUS_TOKENS,
    OUTPUT_TOKENS,
    SELECTION_GAP_S,
    STREAMS,
    TOOL_GAP_S,
    WORKERS,
    failure_probability,
    rejection_probability,
)
from pbkv.live import LiveTask
from pbkv.live.graph import State

from . import checks


@pytest.fixture(scope="module")
def workflows():
    return SwebenchApp().generate(300, 0)


class SequenceRng:
    """Stands in for a numpy generator: ``random()`` returns ``values`` in turn."""

    def __init__(self, searches, values):
        self.searches = searches
        self.values = iter(values)

    def binomial(self, n, p):
        return self.searches - 1

    def random(self):
        return next(self.values)


def retries(workflow):
    return workflow.agents.count("coder") - 1


def workers(workflow):
    return workflow.agents[1::2]


def test_manager_speaks_between_worker_turns(workflows):
    for w in workflows:
        assert set(w.agents[::2]) == {"manager"}
        assert set(workers(w)) <= set(WORKERS)


def test_graph_follows_test_and_review_verdicts(monkeypatch):
    features = {"difficulty": 0.5, "n_files": 2.0, "repo": "psf/requests"}
    task = LiveTask("t", "psf/requests: x", features, (0, 0), STREAMS)
    # test fails, test passes, review rejects, test passes, review approves
    rng = SequenceRng(2, [0.0, 0.99, 0.0, 0.99, 0.99])
    chat = checks.run_with_route(monkeypatch, SwebenchApp(), task, rng)
    path, end_reason = chat.agents, chat.end_reason
    assert path[1::2] == (
        "localizer",
        "localizer",
        "coder",
        "tester",
        "coder",
        "tester",
        "reviewer",
        "coder",
        "tester",
        "reviewer",
    )
    assert end_reason == "end"
    chat = checks.run_with_route(monkeypatch, SwebenchApp(), task, SequenceRng(1, [0.0] * 5))
    path, end_reason = chat.agents, chat.end_reason
    assert path[1::2] == ("localizer", *("coder", "tester") * MAX_CODER_TURNS)
    assert end_reason == "recursion_limit"


def test_chat_ends_with_approval_or_at_the_cap(workflows):
    for w in workflows:
        if w.end_reason == "end":
            assert w.agents[-1] == "reviewer" and retries(w) < MAX_CODER_TURNS
        else:
            assert w.end_reason == "recursion_limit"
            assert retries(w) == MAX_CODER_TURNS - 1 and w.agents[-1] in ("tester", "reviewer")
    assert {w.end_reason for w in workflows} == {"end", "recursion_limit"}


def test_retries_rise_with_difficulty(workflows):
    easy, hard = checks.mean_by_difficulty(workflows, retries)
    assert easy < 0.7
    assert hard > easy + 1.2


def test_localizer_searches_rise_with_the_files_to_change(workflows):
    for w in workflows:
        searches = workers(w).count("localizer")
        assert 1 <= searches <= w.task_features["n_files"]
        assert workers(w)[:searches] == ("localizer",) * searches
    means = [
        statistics.mean(
            workers(w).count("localizer") for w in workflows if w.task_features["n_files"] == n
        )
        for n in (1.0, 2.0, 3.0, 4.0)
    ]
    assert means[0] == 1
    assert all(a + 0.4 < b for a, b in zip(means, means[1:], strict=False))


def test_probabilities_rise_with_difficulty_and_files():
    assert failure_probability(0.0, 1, 0) == pytest.approx(0.05)
    assert failure_probability(1.0, 1, 0) == pytest.approx(0.75)
    assert failure_probability(1.0, 4, 0) == pytest.approx(0.9)
    assert failure_probability(1.0, 4, 2) == pytest.approx(0.74)
    assert failure_probability(0.0, 1, 3) == pytest.approx(0.02)
    assert rejection_probability(0.0, 1) == pytest.approx(0.05)
    assert rejection_probability(1.0, 4) == pytest.approx(0.47)


def test_issue_text_carries_noisy_cues_of_difficulty_and_files(workflows):
    hard = ("intermittent", "caching and serialization", "reverted", "locale settings")
    easy = ("one-liner", "off-by-one", "typo", "easy to reproduce")
    checks.assert_hard_cues_mark_harder_tasks(workflows, hard, easy, margin=0.3)

    def paths(w):
        return len(re.findall(r"`[\w/.]+\.py`", w.task_text))

    by_files = [
        statistics.mean(paths(w) for w in workflows if w.task_features["n_files"] == n)
        for n in (1.0, 2.0, 3.0, 4.0)
    ]
    assert all(a + 0.5 < b for a, b in zip(by_files, by_files[1:], strict=False))

    ranked = sorted(workflows, key=lambda w: w.task_features["difficulty"])
    frames = [w.task_text.count('  File "') for w in ranked]
    assert statistics.mean(frames[-100:]) > statistics.mean(frames[:100]) + 2


def test_outputs_name_the_next_speaker_and_the_verdicts(workflows):
    for w in workflows[:100]:
        for i, step in enumerate(w.steps):
            first_line = decode(step.output_token_ids).splitlines()[0]
            if step.agent == "manager":
                assert first_line == f"Next speaker: {w.agents[i + 1].capitalize()}"
            if step.agent == "reviewer":
                approved = i + 1 == len(w.steps) and w.end_reason == "end"
                assert first_line == ("APPROVED" if approved else "CHANGES REQUESTED")


def test_tool_results_enter_the_context_and_test_logs_say_the_verdict(workflows):
    for w in workflows[:100]:
        for i, (before, after, added) in enumerate(checks.context_additions(w)):
            opener = f"<|im_start|>assistant\n{after.agent.capitalize()}:\n"
            assert added.endswith(opener)
            if before.agent in ("manager", "reviewer"):
                assert added == opener
            else:
                assert added.startswith("<|im_start|>tool\n")
            if before.agent == "tester":
                passed = w.agents[i + 2 : i + 3] == ("reviewer",)
                assert added.endswith(
                    f"=== {'PASSED' if passed else 'FAILED'} ===<|im_end|>\n{opener}"
                )


def test_output_lengths_and_tool_gaps_are_realistic(workflows):
    for w in workflows:
        assert w.steps[0].gap_s == 0.0
        for before, step in zip(w.steps, w.steps[1:], strict=False):
            low, high = TOOL_GAP_S.get(before.agent, SELECTION_GAP_S)
            assert low <= step.gap_s <= high
        for step in w.steps:
            low, high = OUTPUT_TOKENS[step.agent]
            assert low <= step.output_tokens <= high + DIFFICULTY_BONUS_TOKENS.get(step.agent, 0)
    pairs = [(b, s) for w in workflows for b, s in zip(w.steps, w.steps[1:], strict=False)]
    after_tests = [s.gap_s for b, s in pairs if b.agent == "tester"]
    assert min(after_tests) >= 5.0 and max(after_tests) <= 20.0


@pytest.mark.parametrize("worker", ["localizer", "coder", "tester"])
async def test_real_tools_return_a_message_body_the_driver_wraps(worker):
    # the driver renders a real tool's text as a tool message; markers in the text would
    # reach the model twice
    state = State(SwebenchApp().task(0, 0))
    state.visits["coder"] = 1
    result = await swebench.run_tool(worker)(state)
    assert result and "<|im_start|>" not in result and "<|im_end|>" not in result
    if worker == "tester":
        assert result.endswith(text.TEST_VERDICTS[True])  # no failure reported: passes
