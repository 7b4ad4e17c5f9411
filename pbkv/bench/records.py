"""What a bench or sweep writes as JSON: the command that reproduces it, its config, each
row's result (KV statistics included), the gain by part and the bounds."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path

import msgspec

from pbkv.bench.config import BenchConfig
from pbkv.bench.gains import gain_decomposition
from pbkv.bench.results import BenchRun, PolicyResult
from pbkv.bench.sweeps import SweepPoint


def result_record(r: PolicyResult, *, timeline: bool = True) -> dict[str, object]:
    """Return one policy result as a JSON-ready mapping (KV statistics included).

    ``timeline=False`` leaves out the per-invocation hit timeline (large; sweeps don't
    plot it).
    """
    fields = (f.name for f in dataclasses.fields(r))
    return {name: getattr(r, name) for name in fields if timeline or name != "hit_timeline"}


def command_line(argv: Sequence[str] | None) -> str:
    """Return the command that reproduces a run: ``pbkv`` and its arguments ``argv``."""
    if not argv:
        return ""
    return " ".join(["pbkv", *(shlex.quote(a) for a in argv)])


def write_json(
    path: str | Path,
    config: BenchConfig,
    gpu_kv_tokens: int,
    results: Sequence[PolicyResult],
    argv: Sequence[str] | None = None,
    run: BenchRun | None = None,
    *,
    timeline: bool = False,
) -> None:
    """Write the command, config, GPU capacity used, every result, the gain by part
    (``decomposition``: :func:`gain_decomposition`) and the bounds as JSON.

    Each result's per-invocation hit timeline (``hit_timeline``, a pair per invocation:
    most of the file at paper scale) is written only with ``timeline``.

    With ``run``, adds the top-level ``bounds`` object, how the GPU tier was sized
    (``wanted_gpu_kv_tokens``, ``profile_kv_tokens``, ``gpu_kv_capped``) and the open
    loop's session arrival rate in workflows per simulated second
    (``arrival_rate_workflows_per_s``: ``--rate``, or what ``--load`` resolved to; null in
    closed loop).
    """
    payload: dict[str, object] = {
        "kind": "bench",
        "command": command_line(argv),
        "config": config,
        "gpu_kv_tokens": gpu_kv_tokens,
        "results": [result_record(r, timeline=timeline) for r in results],
        "decomposition": gain_decomposition(results),
    }
    if run is not None:
        payload["wanted_gpu_kv_tokens"] = run.wanted_gpu_kv_tokens
        payload["profile_kv_tokens"] = run.profile_kv_tokens
        payload["gpu_kv_capped"] = run.gpu_kv_capped
        payload["bounds"] = run.bounds
        payload["arrival_rate_workflows_per_s"] = run.rate
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))


def write_sweep_json(
    path: str | Path,
    config: BenchConfig,
    points: Sequence[SweepPoint],
    argv: Sequence[str] | None = None,
) -> None:
    """Write the command, config and each point's results and gain by part as JSON."""
    payload = {
        "kind": "sweep",
        "command": command_line(argv),
        "config": config,
        "parameter": points[0].parameter,
        "points": [
            {
                "value": p.value,
                "gpu_kv_tokens": p.gpu_kv_tokens,
                "hit_rate_spread": p.hit_rate_spread,
                "bounds": p.bounds,
                "results": [result_record(r, timeline=False) for r in p.results],
                "decomposition": gain_decomposition(p.results),
            }
            for p in points
        ],
    }
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(payload), indent=2))
