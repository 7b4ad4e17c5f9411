"""The toolloop app: bimodal tool rounds, a noisy cue of them, and the route on reply text."""

import statistics

import pytest

from pbkv.examples import ToolLoopApp, decode, encode
from pbkv.examples import toolloop as loop
from pbkv.examples import toolloop_prompts as text
from pbkv.examples.chat import assistant_opener, encode_piece, end_of_turn
from pbkv.live import END, LiveTask, Simulated, simulate_workflow
from pbkv.live.build import SIM_CONTEXT_TOKENS
from pbkv.live.chat import smollm2_chat
from pbkv.live.graph import State, ToolResult

from . import checks

TOOL_OPENER = "<|im_start|>tool\n"
ASSISTANT_OPENER = "<|im_start|>assistant\nAssistant:\n"
MARKER_TOKENS = len(encode_piece(TOOL_OPENER) + end_of_turn() + assistant_opener("assistant"))
"""The ids a tool round adds to the context besides the tool's result."""


def tool_result(added):
    """Return the text of the tool message that a context addition opens with."""
    assert added.startswith(TOOL_OPENER) and added.endswith(f"<|im_end|>\n{ASSISTANT_OPENER}")
    return added[len(TOOL_OPENER) : -len(f"<|im_end|>\n{ASSISTANT_OPENER}")]


@pytest.fixture(scope="module")
def workflows():
    return ToolLoopApp().generate(300, 0)


def depth(workflow):
    return int(workflow.task_features["depth"])


def cued_kind(workflow):
    (kind,) = [k for k, cues in text.CUES.items() if workflow.task_text.startswith(cues)]
    return kind


def first_line(step):
    return decode(step.output_token_ids).split("\n", 1)[0]


def run(app, task):
    return simulate_workflow(app, task, smollm2_chat(SIM_CONTEXT_TOKENS), workflow_id="w")


def test_tickets_are_quick_or_deep_investigations(workflows):
    quick = [w for w in workflows if w.task_features["kind"] == "quick"]
    deep = [w for w in workflows if w.task_features["kind"] == "deep"]
    assert len(quick) + len(deep) == len(workflows)
    assert 0.5 < len(quick) / len(workflows) < 0.7  # QUICK_PROBABILITY = 0.6
    assert {depth(w) for w in quick} == {1}
    deep_depths = [depth(w) for w in deep]
    assert all(15 <= d <= 40 for d in deep_depths)
    assert min(deep_depths) <= 17 and max(deep_depths) >= 38  # uniform over 15..40
    assert 24 < statistics.mean(deep_depths) < 31


def test_assistant_calls_are_one_more_than_the_tool_rounds(workflows):
    for w in workflows:
        assert set(w.agents) == {"assistant"}
        assert len(w.steps) == (2 if w.task_features["kind"] == "quick" else depth(w) + 1)
        assert w.end_reason == "end"


def test_the_ticket_cue_names_its_kind_four_times_in_five(workflows):
    agree = [cued_kind(w) == w.task_features["kind"] for w in workflows]
    assert 0.7 <= sum(agree) / len(agree) <= 0.9
    for kind in ("quick", "deep"):
        cued = [w for w in workflows if cued_kind(w) == kind]
        assert statistics.mean(w.task_features["kind"] == kind for w in cued) > 0.65


def test_same_seed_same_workflows_other_seed_other_ones(workflows):
    checks.assert_deterministic(ToolLoopApp())
    assert ToolLoopApp().generate(30, 0) == workflows[:30]
    other = ToolLoopApp().generate(30, 1)
    assert [w.task_text for w in other] != [w.task_text for w in workflows[:30]]
    assert [depth(w) for w in other] != [depth(w) for w in workflows[:30]]


def test_each_prompt_and_output_prefix_the_next_prompt(workflows):
    checks.assert_same_agent_prompts_extend(workflows)
    for w in workflows[:60]:
        for before, after, added in checks.context_additions(w):
            assert after.prompt_token_ids[: len(before.prompt_token_ids)] == (
                before.prompt_token_ids
            )
            assert tool_result(added)


def test_replies_act_until_the_final_answer_and_tools_return_their_kind(workflows):
    for w in workflows[:100]:
        lines = [first_line(s) for s in w.steps]
        assert lines[-1] == "Final Answer:"
        assert lines[0].startswith("Action: search[")  # the first round searches
        assert all(line.startswith(("Action: search[", "Action: read[")) for line in lines[:-1])
        for (_, _, added), line in zip(checks.context_additions(w), lines, strict=False):
            snippets = all(row.startswith("[") for row in tool_result(added).splitlines())
            assert snippets == line.startswith("Action: search[")
    reads = [first_line(s).startswith("Action: read[") for w in workflows for s in w.steps[1:-1]]
    assert 0.4 < statistics.mean(reads) < 0.6  # READ_PROBABILITY after the first round


def test_output_lengths_tool_results_and_gaps_are_in_range(workflows):
    for w in workflows:
        assert w.steps[0].gap_s == 0.0
        assert all(0.5 <= s.gap_s <= 3.0 for s in w.steps[1:])
        assert all(40 <= s.output_tokens <= 200 for s in w.steps)
        for before, after in zip(w.steps, w.steps[1:], strict=False):
            added = len(after.prompt_token_ids) - len(
                before.prompt_token_ids + before.output_token_ids
            )
            assert 80 <= added - MARKER_TOKENS <= 300


@pytest.mark.parametrize(
    ("reply", "target"),
    [
        ("Action: search[vpn drops at seven]\nI expect a known issue.", "search"),
        ("Action: read[KB-2041]", "read"),
        ("Thought: the snippet is cut.\nAction: Read[CN-1200]", "read"),
        ("Action: lookup[vpn]", "search"),  # an unknown tool name runs search
        ("Final Answer:\nRestart the VPN client.", END),
        ("Final Answer: see KB-1. Action: read[KB-1]", END),  # the first marker decides
        ("Restart the VPN client, then sign in again.", END),  # neither: taken as the answer
        ("", END),
    ],
)
def test_route_reads_the_first_action_or_final_answer(reply, target):
    state = State(ToolLoopApp().task(0, 0))
    assert loop.route_assistant(state, ToolResult("assistant", reply, 0.0)) == target


def test_a_live_reply_without_an_action_ends_the_workflow(monkeypatch):
    replies = iter(["Thought: check the notices.\nAction: read[CN-1200]", "Use KB-1."])
    monkeypatch.setattr(loop, "simulate_assistant", lambda state: Simulated(next(replies)))
    task = ToolLoopApp().task(0, 0)
    assert task.features["depth"] == 15
    workflow = run(ToolLoopApp(), task)
    assert (workflow.agents, workflow.end_reason) == (("assistant", "assistant"), "end")
    added = decode(workflow.steps[1].segments[2].token_ids)
    result = tool_result(TOOL_OPENER + added.rsplit(TOOL_OPENER, 1)[1])
    assert not result.startswith("[")  # a read ran, not a search


def test_a_loop_that_never_answers_ends_at_the_visit_cap():
    task = LiveTask("t", "Quick question: why?", {"kind": "deep", "depth": 500.0}, (0, 0))
    workflow = run(ToolLoopApp(), task)
    assert workflow.end_reason == "recursion_limit"
    assert len(workflow.steps) == loop.MAX_ASSISTANT_CALLS


@pytest.mark.parametrize("tool", loop.TOOLS)
async def test_real_tools_return_filler_of_the_sims_length(tool):
    state = State(ToolLoopApp().task(0, 0))
    result = await loop.run_tool(tool)(state)
    assert "<|im_start|>" not in result and "<|im_end|>" not in result  # the driver wraps it
    assert 72 <= len(encode(result)) <= 300  # drawn as 80..300 ids; re-encoding merges a few
    assert all(row.startswith("[") for row in result.splitlines()) == (tool == "search")
    assert result != await loop.run_tool(tool)(state)  # each call draws anew
