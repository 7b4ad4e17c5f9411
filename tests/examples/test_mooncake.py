import math
from collections import Counter

import numpy as np
import pytest

from pbkv.examples import MOONCAKE_BLOCK_TOKENS, get_app, load_mooncake


@pytest.mark.parametrize(
    ("name", "requests", "minutes"), [("conversation", 12_031, 59), ("synthetic", 3_993, 17)]
)
def test_traces_match_their_readme(name, requests, minutes):
    trace = load_mooncake(name)
    assert len(trace) == requests
    assert round(trace[-1].timestamp_ms / 60_000) == minutes
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in zip(trace, trace[1:], strict=False))
    for r in trace:  # one hash id per started 512-token block
        assert len(r.hash_ids) == math.ceil(r.input_tokens / MOONCAKE_BLOCK_TOKENS)


def test_unknown_trace_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: conversation, synthetic"):
        load_mooncake("toolagent")


def test_bad_line_names_file_line_and_field(tmp_path):
    (tmp_path / "mooncake").mkdir()
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'
    bad = '{"timestamp": 5, "input_length": -1, "output_length": 2, "hash_ids": [0]}'
    (tmp_path / "mooncake" / "synthetic_trace.jsonl").write_text(f"{good}\n{bad}\n")
    with pytest.raises(ValueError, match=r"synthetic_trace\.jsonl:2: .*\$\.input_length"):
        load_mooncake("synthetic", tmp_path)


def _shared_prefix_tokens(a, b):
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _shared_hash_ids(a, b):
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_app_workflows_reproduce_the_trace_block_structure():
    trace = load_mooncake("conversation")[:120]
    workflows = get_app("mooncake").generate(120, 0)
    assert [w.workflow_id for w in workflows[:2]] == ["mooncake-0-0", "mooncake-0-1"]
    prompts = [np.array(w.steps[0].prompt_token_ids) for w in workflows]
    pairs_sharing = 0
    for i, (r, w) in enumerate(zip(trace, workflows, strict=True)):
        (step,) = w.steps
        assert step.agent == "request"
        assert step.prompt_tokens == r.input_tokens
        assert step.output_tokens == r.output_tokens
        assert w.arrival_s == r.timestamp_ms / 1000
        for j, s in enumerate(trace[:i]):
            k = _shared_hash_ids(r.hash_ids, s.hash_ids)
            shared = _shared_prefix_tokens(prompts[i], prompts[j])
            shortest = min(r.input_tokens, s.input_tokens)
            # k equal leading blocks give k * 512 equal tokens (fewer if a prompt ends
            # inside them) and not one token more: distinct blocks never collide
            assert shared == min(k * MOONCAKE_BLOCK_TOKENS, shortest)
            pairs_sharing += k > 0
    assert pairs_sharing > 0  # the sample does exercise shared prefixes


def test_bench_replays_open_loop_and_pbkv_stays_with_lru():
    from pbkv.bench.compare import BenchConfig, run_bench

    config = BenchConfig(
        app="mooncake",
        policies=("lru", "pbkv"),
        workflows=40,
        hardware="h200",
        model="qwen3-14b",
    )
    arrivals = {w.workflow_id: w.arrival_s for w in get_app("mooncake").generate(40, 0)}
    starts = []  # (row, workflow, start) of the lru, pbkv and uncontested runs
    run = run_bench(
        config, on_outcome=lambda row, o: starts.append((row, o.workflow_id, o.start_s))
    )
    # open loop: no request starts before it arrived (closed loop starts 7 of these 40
    # early: the trace's first 40 arrivals span 12 s)
    assert Counter(row for row, _, _ in starts) == {"lru": 40, "pbkv": 40, "uncontested": 40}
    assert all(start >= arrivals[wf] - 1e-9 for _, wf, start in starts)
    lru, pbkv = run.results
    assert run.bounds is not None
    for row in run.results:
        assert row.end_reasons["end"] == 40
        assert row.total_hit_rate <= run.bounds.ceiling_hit_rate + 1e-12
    assert lru.total_hit_rate > 0  # the trace does reuse prefixes
    assert pbkv.total_hit_rate >= lru.total_hit_rate - 0.01
