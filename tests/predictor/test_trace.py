import logging

import msgspec
import pytest

from pbkv.predictor import (
    TRACE_VERSION,
    SegmentCount,
    TraceFileError,
    TraceLineError,
    TraceRecord,
    TraceStep,
    read_traces,
    write_traces,
)


def _full_record() -> TraceRecord:
    return TraceRecord(
        version=TRACE_VERSION,
        app="codegen",
        task_id="task-7",
        task_text="write a parser",
        steps=[
            TraceStep("planner", [SegmentCount("preamble", 64), SegmentCount("role", 12)], 40),
            TraceStep("coder", [SegmentCount("context", 300)], 200, gap_s=1.5),
        ],
        end_reason="recursion_limit",
        task_features={"difficulty": 0.75, "lang": "py"},
    )


def test_round_trip_preserves_records(tmp_path, make_record):
    records = [_full_record(), make_record("a", "b", task_id="t1")]
    path = tmp_path / "traces.jsonl"

    assert write_traces(path, records) == 2
    result = read_traces(path)

    assert result.records == records
    assert result.errors == []
    assert path.read_bytes().count(b"\n") == 2


def _write_mixed(path, good) -> None:
    lines = [
        msgspec.json.encode(good),
        b"{not json",
        b"",
        msgspec.json.encode(good).replace(b'"output_tokens":40', b'"output_tokens":-1'),
        msgspec.json.encode(good).replace(b'"version":1', b'"version":99'),
        msgspec.json.encode(good),
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_bad_lines_are_skipped_and_reported_with_line_and_field(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    good = _full_record()
    _write_mixed(path, good)

    with caplog.at_level(logging.WARNING, logger="pbkv.predictor.trace"):
        records, errors = read_traces(path)

    assert records == [good, good]
    assert [e.line for e in errors] == [2, 4, 5]
    assert all(e.path == path for e in errors)
    assert "malformed" in errors[0].message
    assert "$.steps[0].output_tokens" in errors[1].message
    assert "unsupported trace version 99 (expected 1)" in errors[2].message
    assert "$.version" in errors[2].message
    assert str(errors[1]).startswith(f"{path}:4: ")
    assert len(caplog.records) == 3
    assert f"{path}:2:" in caplog.records[0].getMessage()


def test_strict_raises_on_first_bad_line(tmp_path):
    path = tmp_path / "mixed.jsonl"
    _write_mixed(path, _full_record())

    with pytest.raises(TraceFileError, match=r"mixed\.jsonl:2: JSON is malformed") as info:
        read_traces(path, strict=True)

    assert isinstance(info.value, ValueError)
    assert info.value.error == TraceLineError(path, 2, info.value.error.message)


def test_schema_error_names_missing_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"version": 1, "app": "a"}\n')

    with pytest.raises(TraceFileError, match=r"t\.jsonl:1: .*`task_id`"):
        read_traces(path, strict=True)


def test_context_tail_round_trips(tmp_path):
    step = TraceStep("agent", [SegmentCount("context", 9)], 3, 0.5, context_tail="user: hi")
    record = TraceRecord(TRACE_VERSION, "taubench", "t-0", "hi", [step, TraceStep("user", [], 1)])
    path = tmp_path / "tail.jsonl"
    write_traces(path, [record])

    (read,) = read_traces(path, strict=True).records
    assert read == record
    assert [s.context_tail for s in read.steps] == ["user: hi", ""]


def test_a_line_written_before_context_tail_still_decodes(tmp_path):
    line = (
        '{"version":1,"app":"demo","task_id":"t0","task_text":"do it",'
        '"steps":[{"agent":"a","segments":[["role",10]],"output_tokens":5,"gap_s":0.0}],'
        '"end_reason":"end","task_features":{}}\n'
    )
    path = tmp_path / "old.jsonl"
    path.write_text(line)

    (record,) = read_traces(path, strict=True).records
    assert record.steps[0].context_tail == ""
    assert record.steps[0].agent == "a"
