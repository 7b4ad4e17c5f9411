import math

import pytest

from pbkv.examples import MOONCAKE_BLOCK_TOKENS, load_mooncake


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
