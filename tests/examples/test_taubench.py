import json
import statistics
from collections import Counter

import pytest

from pbkv.examples import TOOL_LATENCY_S, TauBenchApp, decode, encode, find_data_file
from pbkv.examples.data import read_data_text
from pbkv.examples.taubench import DATA_FILE, TAIL_CHARS

# Measured in the reference copy's README (shared/data/README.md): agent LLM calls per episode,
# median 11, max 30.
README_AGENT_CALLS_MEDIAN = 11
README_AGENT_CALLS_MAX = 30


@pytest.fixture(scope="module")
def raw():
    return json.loads(read_data_text(find_data_file(DATA_FILE)))


@pytest.fixture(scope="module")
def workflows():
    return TauBenchApp().generate(200, 0)


def test_all_200_episodes_load_once_each(workflows, raw):
    assert len(raw) == 200
    assert Counter(w.task_id for w in workflows) == Counter(
        f"{e['task_id']}-{e['trial']}" for e in raw
    )
    assert len({w.workflow_id for w in workflows}) == 200


def test_agent_calls_per_episode_match_the_data_readme(workflows):
    agent_calls = [w.agents.count("agent") for w in workflows]
    assert statistics.median(agent_calls) == README_AGENT_CALLS_MEDIAN
    assert max(agent_calls) == README_AGENT_CALLS_MAX


def test_steps_are_the_assistant_and_later_user_messages(raw):
    by_id = {f"{e['task_id']}-{e['trial']}": e for e in raw}
    for w in TauBenchApp().generate(200, 5):
        roles = [m["role"] for m in by_id[w.task_id]["traj"][2:] if m["role"] != "tool"]
        assert w.agents == tuple("agent" if r == "assistant" else "user" for r in roles)
        assert w.task_text == by_id[w.task_id]["traj"][1]["content"]
        assert w.end_reason == "end"


def test_gap_is_tool_latency_per_tool_message(workflows, raw):
    tool_messages = sum(m["role"] == "tool" for e in raw for m in e["traj"])
    total_gap_s = sum(s.gap_s for w in workflows for s in w.steps)
    trailing = sum(e["traj"][-1]["role"] == "tool" for e in raw)  # tools after the last call
    assert total_gap_s == pytest.approx((tool_messages - trailing) * TOOL_LATENCY_S)
    assert {s.gap_s for w in workflows for s in w.steps if s.agent == "user"} == {0.0}


def test_agent_preamble_is_identical_across_episodes(workflows):
    agent_steps = [s for w in workflows for s in w.steps if s.agent == "agent"]
    assert len({s.segments[0].token_ids for s in agent_steps}) == 1
    assert len({s.segments[1].token_ids for s in agent_steps}) == 1
    policy = decode(agent_steps[0].segments[0].token_ids)
    assert policy.startswith("<|im_start|>system\n# Airline Agent Policy")
    user_steps = [s for w in workflows for s in w.steps if s.agent == "user"]
    assert {s.segments[0].token_ids for s in user_steps} == {()}
    assert len({s.segments[1].token_ids for s in user_steps}) == 1


def test_every_prompt_ends_with_the_assistant_opener(workflows):
    opener = encode("<|im_start|>assistant\n")
    for step in (s for w in workflows for s in w.steps):
        assert step.prompt_token_ids[-len(opener) :] == opener


def test_user_simulator_sees_its_instruction_and_flipped_roles(workflows, raw):
    w = next(w for w in workflows if "user" in w.agents)
    step = next(s for s in w.steps if s.agent == "user")
    context = decode(step.segments[2].token_ids)
    instruction = next(
        e["info"]["task"]["instruction"] for e in raw if f"{e['task_id']}-{e['trial']}" == w.task_id
    )
    assert instruction in context
    assert f"<|im_start|>assistant\n{w.task_text}<|im_end|>" in context
    assert "<|im_start|>tool" not in context


def test_seed_shuffles_order_and_is_deterministic():
    app = TauBenchApp()
    first = [w.task_id for w in app.generate(200, 1)]
    assert first == [w.task_id for w in app.generate(200, 1)]
    assert first != [w.task_id for w in app.generate(200, 2)]
    assert [w.task_id for w in app.generate(20, 1)] == first[:20]


def test_more_workflows_than_episodes_reuse_each_evenly():
    workflows = TauBenchApp().generate(450, 3)
    assert len({w.workflow_id for w in workflows}) == 450
    assert set(Counter(w.task_id for w in workflows).values()) == {2, 3}


def test_missing_trajectories_name_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("PBKV_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"gpt-4o-airline\.json not found"):
        TauBenchApp().generate(1, 0)


def test_malformed_episode_names_the_file_and_field(tmp_path):
    path = tmp_path / DATA_FILE
    path.parent.mkdir()
    episode = {"task_id": 0, "reward": 1.0, "info": {"task": {"instruction": "x"}}}
    path.write_text(json.dumps([episode]))
    with pytest.raises(ValueError, match=r"gpt-4o-airline\.json: episode 0: missing field 'traj'"):
        TauBenchApp(tmp_path).generate(1, 0)
    episode["traj"] = [{"role": "user", "content": "hi"}] * 3
    path.write_text(json.dumps([episode]))
    with pytest.raises(ValueError, match=r"traj\[0\]\.role is 'user', expected 'system'"):
        TauBenchApp(tmp_path).generate(1, 0)


def test_context_tail_is_the_latest_messages_before_each_call(workflows, raw):
    by_id = {f"{e['task_id']}-{e['trial']}": e for e in raw}
    workflow = workflows[0]
    traj = by_id[workflow.task_id]["traj"]
    first, second = workflow.steps[0], workflow.steps[1]
    assert first.context_tail.startswith(f"user: {traj[1]['content']}"[:TAIL_CHARS])
    assert all(s.context_tail for s in workflow.steps)
    assert all(len(s.context_tail) <= TAIL_CHARS for w in workflows for s in w.steps)
    # the user simulator's tail is the agent's latest message
    user_steps = [s for s in workflow.steps if s.agent == "user"]
    assert all(s.context_tail.startswith("agent: ") for s in user_steps)
    trace = workflow.to_trace()
    assert [s.context_tail for s in trace.steps] == [s.context_tail for s in workflow.steps]
    assert second.context_tail != first.context_tail
