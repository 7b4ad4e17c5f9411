import statistics

import pytest

from pbkv.examples import MAX_REPLANS, HoverApp, decode
from pbkv.examples.hover import (
    DIFFICULTY_BONUS_TOKENS,
    OUTPUT_TOKENS,
    PASSAGE_TOKENS,
    STREAMS,
    planned_hops,
    replan_probability,
)
from pbkv.live import LiveTask

from . import checks


@pytest.fixture(scope="module")
def workflows():
    return HoverApp().generate(200, 0)


class ConstantRng:
    """Stands in for a numpy generator whose every draw is ``value``."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def searches(workflow):
    return workflow.agents.count("retriever")


def replans(workflow):
    return workflow.agents.count("decomposer") - 1


def first_round(workflow):
    agents = workflow.agents
    return agents[: agents.index("verifier") + 1]


def test_first_round_searches_exactly_the_hidden_hop_count(workflows):
    for w in workflows:
        hops = int(w.task_features["hops"])
        assert first_round(w).count("retriever") == hops
        assert searches(w) == hops + replans(w)  # a re-plan searches for one missing hop
        assert len(w.steps) == 3 * hops + 1 + 4 * replans(w)
    assert {w.task_features["hops"] for w in workflows} == {2.0, 3.0, 4.0}


def test_mean_searches_rise_with_the_hidden_hop_count(workflows):
    means = [
        statistics.mean(searches(w) for w in workflows if w.task_features["hops"] == hops)
        for hops in (2.0, 3.0, 4.0)
    ]
    assert means[0] + 0.8 < means[1] < means[2] - 0.8


def test_replans_rise_with_difficulty_and_stop_at_the_cap(workflows):
    easy, hard = checks.mean_by_difficulty(workflows, replans)
    assert easy < 0.2
    assert hard > easy + 0.25
    for w in workflows:
        capped = replans(w) == MAX_REPLANS and w.end_reason == "recursion_limit"
        assert capped or (w.end_reason == "end" and replans(w) <= MAX_REPLANS)


def test_graph_replans_until_the_cap_then_ends_with_recursion_limit(monkeypatch):
    task = LiveTask("t", "Claim: x", {"hops": 3.0, "difficulty": 1.0}, (0, 0), STREAMS)
    hop = ("query_rewriter", "retriever", "reader")
    first = ("decomposer", "retriever", "reader", *hop, *hop, "verifier")
    replan = ("decomposer", "retriever", "reader", "verifier")
    capped = checks.run_with_route(monkeypatch, HoverApp(), task, ConstantRng(0.0))
    assert (capped.agents, capped.end_reason) == (first + replan * MAX_REPLANS, "recursion_limit")
    ended = checks.run_with_route(monkeypatch, HoverApp(), task, ConstantRng(0.99))
    assert (ended.agents, ended.end_reason) == (first, "end")


def test_a_real_decomposer_plans_its_numbered_sub_questions():
    assert planned_hops("1. Who directed X?\n2. Where was #1 born?\nCheck: ...") == 2
    assert planned_hops("no plan at all") == 1
    assert planned_hops("\n".join(f"{i}. q" for i in range(1, 9))) == 4


def test_replan_probability_rises_with_difficulty_and_hops_and_falls_per_replan():
    assert replan_probability(0.0, 2, 0) == pytest.approx(0.02)
    assert replan_probability(1.0, 2, 0) == pytest.approx(0.47)
    assert replan_probability(1.0, 4, 0) == pytest.approx(0.59)
    assert replan_probability(1.0, 4, 1) == pytest.approx(0.39)
    assert replan_probability(0.2, 2, 2) == pytest.approx(0.02)


def test_claim_text_carries_noisy_cues_of_hops_and_difficulty(workflows):
    def relation_words(w):
        claim = w.task_text.splitlines()[0]
        return sum(claim.count(word) for word in (" of ", " that ", " where "))

    by_hops = [
        statistics.mean(relation_words(w) for w in workflows if w.task_features["hops"] == h)
        for h in (2.0, 3.0, 4.0)
    ]
    assert by_hops[0] + 0.5 < by_hops[1] < by_hops[2] - 0.5

    def mean_difficulty(cues, absent=False):
        hits = [
            w.task_features["difficulty"]
            for w in workflows
            if any(c in w.task_text for c in cues) != absent
        ]
        return statistics.mean(hits)

    hedged = ("said to", "reportedly", "believed to", "apparently")
    tricky = ("was not", "never", "more than a decade", "but not at", "earlier than any")
    plain = mean_difficulty(hedged + tricky, absent=True)
    assert plain + 0.2 < mean_difficulty(hedged) < mean_difficulty(tricky) - 0.2


def test_query_rewriter_signs_with_its_joined_name(workflows):
    assert decode(workflows[0].steps[3].segments[2].token_ids[-8:]).endswith("QueryRewriter:\n")


def test_retrieved_passages_enter_the_context_and_dominate_it(workflows):
    for w in workflows[:60]:
        for before, after, added in checks.context_additions(w):
            opener = added[added.rindex("<|im_start|>assistant\n") :]
            assert opener.endswith(":\n") and opener.count("\n") == 2
            if before.agent == "retriever":
                assert added.startswith("<|im_start|>tool\n[")
                assert added.endswith("<|im_end|>\n<|im_start|>assistant\nReader:\n")
                context_tokens = len(before.segments[2].token_ids) + before.output_tokens
                n_passages = len(after.segments[2].token_ids) - context_tokens
                assert PASSAGE_TOKENS[0] <= n_passages <= PASSAGE_TOKENS[1] + 20
            else:
                assert added == opener
    prompt = sum(s.prompt_tokens for w in workflows for s in w.steps)
    output = sum(s.output_tokens for w in workflows for s in w.steps)
    assert prompt > 30 * output


def test_verdict_says_whether_the_verifier_replans(workflows):
    for w in workflows:
        for i, step in enumerate(w.steps):
            if step.agent != "verifier":
                continue
            replanned = i + 1 < len(w.steps) or w.end_reason == "recursion_limit"
            verdict = decode(step.output_token_ids).splitlines()[0]
            assert (verdict == "Verdict: NOT ENOUGH INFO (re-plan the missing hops)") == replanned


def test_output_lengths_and_gaps_are_realistic(workflows):
    for step in (s for w in workflows for s in w.steps):
        low, high = OUTPUT_TOKENS[step.agent]
        assert low <= step.output_tokens <= high + DIFFICULTY_BONUS_TOKENS.get(step.agent, 0)
        assert 30 <= step.output_tokens <= 200
        if step.agent == "reader":
            assert 0.3 <= step.gap_s <= 1.5
    assert all(w.steps[0].gap_s == 0.0 for w in workflows)
