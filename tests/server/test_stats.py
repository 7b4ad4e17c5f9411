"""Statistics as JSON and as Prometheus text."""

import msgspec

from pbkv.server.stats import HTTPCounters, prometheus_text, snapshot


class _KV(msgspec.Struct):
    policy: str
    prompt_tokens: int
    cached_gpu_tokens: int

    @property
    def gpu_hit_rate(self) -> float:
        return self.cached_gpu_tokens / self.prompt_tokens


class _Runtime(msgspec.Struct):
    kv: _KV
    queued_requests: int
    ended_by_reason: dict[str, int]


class _Sessions(msgspec.Struct):
    active: int


def _sources():
    http = HTTPCounters()
    http.count("/v1/chat/completions", 200)
    http.count("/v1/chat/completions", 200)
    http.count("/v1/chat/completions", 400)
    http.disconnects = 1
    runtime = _Runtime(_KV("pbkv", 200, 50), 3, {"end": 4, "aborted": 1})
    return {"runtime_stats": runtime, "sessions": _Sessions(2), "http": http}


def test_snapshot_adds_hit_rates_and_groups_responses():
    doc = snapshot(model="tiny", workflows=[], **_sources())
    assert doc["runtime"]["kv"]["gpu_hit_rate"] == 0.25
    assert doc["http"]["responses"] == {"/v1/chat/completions": {"200": 2, "400": 1}}
    assert doc["sessions"] == {"active": 2}


def test_prometheus_text_has_one_sample_per_numeric_leaf():
    lines = prometheus_text(**_sources()).splitlines()
    assert 'pbkv_http_responses{route="/v1/chat/completions",status="200"} 2' in lines
    assert "pbkv_runtime_kv_cached_gpu_tokens 50" in lines
    assert "pbkv_runtime_kv_gpu_hit_rate 0.25" in lines
    assert "pbkv_runtime_queued_requests 3" in lines
    assert 'pbkv_runtime_ended_by_reason{key="end"} 4' in lines
    assert "pbkv_sessions_active 2" in lines
    assert "pbkv_http_disconnects 1" in lines
    assert not any("policy" in line for line in lines)  # strings are not metrics
    types = [line for line in lines if line.startswith("# TYPE pbkv_runtime_ended_by_reason")]
    assert types == ["# TYPE pbkv_runtime_ended_by_reason gauge"]
