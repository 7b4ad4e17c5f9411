"""Lifecycle events: tagged msgspec Structs that survive a JSON round trip (§3, §4)."""

import msgspec
import pytest

from pbkv.actors.events import (
    AgentFinished,
    AgentInvoked,
    LifecycleEvent,
    PrefillDone,
    WorkflowStarted,
    WorkflowTerminated,
)
from pbkv.runtime import EventRecorder, read_events

EVENTS = [
    WorkflowStarted("wf1", "codegen", "t7", "acme", 1.5, "write a parser"),
    AgentInvoked("wf1", 0, "planner", [32, 16, 20], 1.5),
    PrefillDone("wf1", 0, 32, 16, 20, [0.25, -1.0], 2.0),
    PrefillDone("wf1", 1, 0, 0, 68),
    AgentFinished("wf1", 0, "planner", 4, 0.75, 2.25, 0.5),
    WorkflowTerminated("wf1", "end", 9.0),
]
DECODER = msgspec.json.Decoder(LifecycleEvent)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_round_trip_through_json(event):
    data = msgspec.json.encode(event)
    assert msgspec.json.decode(data)["type"] == type(event).__name__  # the tag
    decoded = DECODER.decode(data)
    assert type(decoded) is type(event)
    assert decoded == event


def test_events_are_frozen():
    with pytest.raises(AttributeError):
        EVENTS[0].workflow_id = "other"


def test_old_records_without_newer_fields_still_decode():
    data = b'{"type":"AgentFinished","workflow_id":"w","step":2,"agent":"coder",'
    data += b'"output_tokens":9,"latency_s":1.25}'
    assert DECODER.decode(data) == AgentFinished("w", 2, "coder", 9, 1.25, 0.0, 0.0)


def test_unknown_tag_and_bad_reason_are_rejected():
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'Bogus'"):
        DECODER.decode(b'{"type":"Bogus","workflow_id":"w"}')
    with pytest.raises(msgspec.ValidationError, match="reason"):
        DECODER.decode(b'{"type":"WorkflowTerminated","workflow_id":"w","reason":"crashed"}')


def test_recorder_writes_one_line_per_event_and_reads_them_back(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventRecorder(path) as recorder:
        for event in EVENTS:
            recorder.record(event)
    assert recorder.recorded == len(EVENTS)
    assert len(path.read_bytes().splitlines()) == len(EVENTS)
    assert read_events(path, LifecycleEvent) == EVENTS
