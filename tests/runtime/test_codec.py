import msgspec
import pytest

from pbkv.runtime import EventRecorder, iter_events, read_events


class WorkflowStarted(msgspec.Struct, tag=True, frozen=True):
    workflow_id: str
    app: str


class AgentFinished(msgspec.Struct, tag=True, frozen=True):
    workflow_id: str
    step: int
    latency_s: float


Event = WorkflowStarted | AgentFinished


class Untagged(msgspec.Struct, frozen=True):
    x: int


class Mutable(msgspec.Struct, tag=True):
    x: int


EVENTS = [
    WorkflowStarted("w1", "codegen"),
    AgentFinished("w1", 0, 0.25),
    AgentFinished("w1", 1, 1.5),
]


def test_round_trip_preserves_events_and_order(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventRecorder(path) as recorder:
        for event in EVENTS:
            recorder.record(event)
        assert recorder.recorded == 3
    assert path.read_text().splitlines()[0] == (
        '{"type":"WorkflowStarted","workflow_id":"w1","app":"codegen"}'
    )
    assert read_events(path, Event) == EVENTS
    assert list(iter_events(str(path), Event)) == EVENTS


def test_recorder_appends_to_an_existing_log(tmp_path):
    path = tmp_path / "events.jsonl"
    for event in EVENTS:
        with EventRecorder(path) as recorder:
            recorder.record(event)
    assert read_events(path, Event) == EVENTS


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('\n{"type":"AgentFinished","workflow_id":"w","step":2,"latency_s":0.5}\n\n')
    assert read_events(path, AgentFinished) == [AgentFinished("w", 2, 0.5)]


def test_bad_line_raises_value_error_with_file_and_line_number(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventRecorder(path) as recorder:
        recorder.record(EVENTS[0])
    with path.open("a") as file:
        file.write('{"type":"AgentFinished","workflow_id":"w1","step":"two","latency_s":1.0}\n')
    with pytest.raises(ValueError, match=rf"^{path}: line 2: Expected `int`, got `str`") as info:
        read_events(path, Event)
    assert isinstance(info.value.__cause__, msgspec.ValidationError)


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"type":"WorkflowStarted","workflow_id":"w","app":"a"}\n\n{not json\n')
    with pytest.raises(ValueError, match=rf"^{path}: line 3: JSON is malformed"):
        read_events(path, Event)


@pytest.mark.parametrize("event", [Untagged(1), Mutable(1), {"type": "dict"}])
def test_recorder_only_accepts_tagged_frozen_structs(tmp_path, event):
    with EventRecorder(tmp_path / "events.jsonl") as recorder, pytest.raises(TypeError):
        recorder.record(event)


def test_recording_after_close_raises(tmp_path):
    recorder = EventRecorder(tmp_path / "events.jsonl")
    recorder.close()
    recorder.close()
    with pytest.raises(ValueError, match="is closed"):
        recorder.record(EVENTS[0])
