from collections.abc import Callable

import pytest

from pbkv.predictor import TRACE_VERSION, SegmentCount, TraceRecord, TraceStep


def _record(*agents: str, task_id: str = "t0", task: str | None = None) -> TraceRecord:
    steps = [
        TraceStep(agent=a, segments=[SegmentCount("role", 10 + i)], output_tokens=5 + i)
        for i, a in enumerate(agents)
    ]
    return TraceRecord(
        version=TRACE_VERSION,
        app="demo",
        task_id=task_id,
        task_text="do it",
        steps=steps,
        task_features={} if task is None else {"task": task},
    )


@pytest.fixture
def make_record() -> Callable[..., TraceRecord]:
    """Build a trace whose steps run ``agents`` in order."""
    return _record
