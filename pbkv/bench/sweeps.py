"""Parameter sweeps over one workload: concurrency, score horizon K, prediction noise (§9).

Each point runs every policy of the config on the same generated workload (same seed),
so a sweep shows where policies differ and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pbkv.actors.workflow import WorkflowOutcome
from pbkv.bench.compare import run_bench
from pbkv.bench.config import BenchConfig
from pbkv.bench.results import Bounds, PolicyResult
from pbkv.bench.workload import gpu_tokens_for

Parameter = Literal["concurrency", "horizon", "noise"]
PARAMETERS: tuple[Parameter, ...] = ("concurrency", "horizon", "noise")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One value of the swept parameter and every policy's result there."""

    parameter: Parameter
    value: float
    gpu_kv_tokens: int
    results: tuple[PolicyResult, ...]
    bounds: Bounds | None = None

    @property
    def hit_rate_spread(self) -> float:
        """Best minus worst GPU hit rate across policies at this point."""
        rates = [r.gpu_hit_rate for r in self.results]
        return max(rates) - min(rates)


def sweep(
    config: BenchConfig,
    parameter: Parameter,
    values: Sequence[float],
    *,
    on_outcome: Callable[[float, str, WorkflowOutcome], None] | None = None,
) -> list[SweepPoint]:
    """Run ``config``'s policies at each value of ``parameter``.

    A concurrency sweep keeps the GPU tier fixed across points (``config.gpu_kv_tokens``,
    or the default sizing at the median swept concurrency), so pressure rises with
    concurrency and the band where policies differ shows.

    Raises:
        ValueError: unknown parameter, no values, or a value invalid for the parameter.
    """
    if parameter not in PARAMETERS:
        raise ValueError(f"unknown sweep parameter {parameter!r}; known: {', '.join(PARAMETERS)}")
    if not values:
        raise ValueError("a sweep needs at least one value")
    if parameter == "concurrency" and config.gpu_kv_tokens is None:
        config = dataclasses.replace(config, gpu_kv_tokens=_fixed_gpu_tokens(config, values))
    points = []
    for value in values:
        changes: dict[str, Any] = {parameter: _typed(parameter, value)}  # one field, typed
        point_config = dataclasses.replace(config, **changes)
        callback = None if on_outcome is None else (lambda p, o, v=value: on_outcome(v, p, o))
        run = run_bench(point_config, on_outcome=callback)
        points.append(
            SweepPoint(parameter, float(value), run.gpu_kv_tokens, tuple(run.results), run.bounds)
        )
    return points


def _typed(parameter: Parameter, value: float) -> float | int:
    if parameter == "noise":
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {value}")
        return float(value)
    if value != int(value) or value < 1:
        raise ValueError(f"{parameter} values must be integers >= 1, got {value}")
    return int(value)


def _fixed_gpu_tokens(config: BenchConfig, values: Sequence[float]) -> int:
    from pbkv.examples import get_app

    workload = get_app(config.app).generate(config.workflows, config.seed)
    middle = sorted(int(v) for v in values)[len(values) // 2]
    return gpu_tokens_for(workload, middle)
