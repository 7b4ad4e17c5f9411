import statistics

import pytest

from pbkv.examples import MAX_REPLANS, App, HoverApp, HoverTask, decode, get_app, validate_path
from pbkv.examples.hover import (
    AGENTS,
    DIFFICULTY_BONUS_TOKENS,
    OUTPUT_TOKENS,
    PASSAGE_TOKENS,
    replan_probability,
    sample_path,
)


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


def test_registered_as_hover():
    app = get_app("hover")
    assert isinstance(app, HoverApp) and isinstance(app, App)
    assert app.generate(2, 5) == HoverApp().generate(2, 5)


def test_same_seed_same_workflows_and_prefix_stable():
    app = HoverApp()
    assert app.generate(8, 3) == app.generate(8, 3)
    assert app.generate(8, 3)[:5] == app.generate(5, 3)
    assert app.generate(8, 3) != app.generate(8, 4)


def test_ids_are_unique_and_named_by_seed(workflows):
    assert [w.workflow_id for w in workflows[:3]] == ["hover-0-0", "hover-0-1", "hover-0-2"]
    assert len({w.workflow_id for w in workflows}) == len(workflows)
    assert all(w.app == "hover" for w in workflows)


def test_every_path_is_a_walk_of_the_call_graph(workflows):
    app = HoverApp()
    for w in workflows:
        validate_path(app, w.agents)


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
    ranked = sorted(workflows, key=lambda w: w.task_features["difficulty"])
    third = len(ranked) // 3
    easy = statistics.mean(replans(w) for w in ranked[:third])
    hard = statistics.mean(replans(w) for w in ranked[-third:])
    assert easy < 0.2
    assert hard > easy + 0.25
    for w in workflows:
        capped = replans(w) == MAX_REPLANS and w.end_reason == "recursion_limit"
        assert capped or (w.end_reason == "end" and replans(w) <= MAX_REPLANS)


def test_sample_path_replans_until_the_cap_then_ends_with_recursion_limit():
    task = HoverTask("t", "", hops=3, difficulty=1.0)
    hop = ("query_rewriter", "retriever", "reader")
    first = ("decomposer", "retriever", "reader", *hop, *hop, "verifier")
    replan = ("decomposer", "retriever", "reader", "verifier")
    assert sample_path(task, ConstantRng(0.0)) == (first + replan * MAX_REPLANS, "recursion_limit")
    assert sample_path(task, ConstantRng(0.99)) == (first, "end")


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


def test_previous_same_agent_prompt_and_output_prefix_the_next_prompt(workflows):
    for w in workflows[:60]:
        last = {}
        for step in w.steps:
            prompt = step.prompt_token_ids
            if step.agent in last:
                before = last[step.agent]
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
    assert 1000 <= len(steps[0].segments[0].token_ids) <= 2000
    assert all(300 <= len(r) <= 800 for r in roles.values())


def test_context_starts_with_the_claim_and_outputs_end_the_turn(workflows):
    w = workflows[0]
    first = decode(w.steps[0].segments[2].token_ids)
    assert first.startswith(f"<|im_start|>user\n## Task\n{w.task_text}<|im_end|>")
    assert first.endswith("<|im_start|>assistant\nDecomposer:\n")
    assert decode(w.steps[3].segments[2].token_ids[-8:]).endswith("QueryRewriter:\n")
    assert all(decode(s.output_token_ids).endswith("<|im_end|>\n") for s in w.steps)


def test_retrieved_passages_enter_the_context_and_dominate_it(workflows):
    for w in workflows[:60]:
        for before, after in zip(w.steps, w.steps[1:], strict=False):
            context = before.segments[2].token_ids + before.output_token_ids
            assert after.segments[2].token_ids[: len(context)] == context
            added = decode(after.segments[2].token_ids[len(context) :])
            opener = added[added.rindex("<|im_start|>assistant\n") :]
            assert opener.endswith(":\n") and opener.count("\n") == 2
            if before.agent == "retriever":
                assert added.startswith("<|im_start|>tool\n[")
                assert added.endswith("<|im_end|>\n<|im_start|>assistant\nReader:\n")
                n_passages = len(after.segments[2].token_ids) - len(context)
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


def test_negative_seed_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        HoverApp().generate(1, -1)
