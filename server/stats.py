"""The server's statistics: HTTP counters, and the runtime's and sessions' as JSON or text.

``GET /stats`` answers :func:`snapshot` as JSON; ``GET /metrics`` answers
:func:`prometheus_text`, the Prometheus text exposition format (version 0.0.4): every
numeric field of the statistics records becomes a gauge named by its path
(``pbkv_runtime_kv_cached_gpu_tokens``), and a mapping of numbers (``ended_by_reason``)
one gauge with a label per key.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec


class HTTPCounters:
    """Requests answered, by route and status; requests cancelled by a client disconnect."""

    def __init__(self) -> None:
        self.responses: collections.Counter[tuple[str, int]] = collections.Counter()
        self.disconnects = 0
        self.in_flight = 0

    def count(self, route: str, status: int) -> None:
        """Count one answered request."""
        self.responses[(route, status)] += 1

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as plain data."""
        by_route: dict[str, dict[str, int]] = {}
        for (route, status), n in sorted(self.responses.items()):
            by_route.setdefault(route, {})[str(status)] = n
        return {
            "responses": by_route,
            "disconnects": self.disconnects,
            "in_flight": self.in_flight,
        }


class Serving(msgspec.Struct, frozen=True):
    """What the server runs: the cache policy, the admission scheduler and the predictor,
    and the predictor's running top-1 accuracy (``online``: scored on each ended
    workflow before it learns from it; ``nan``/``null`` before the first).

    Attributes:
        policy / scheduler: the names the runtime runs.
        predictor: the forecaster chain, first to last fallback (``none``: no forecasts).
        predictor_workflows_learned: ended workflows the online forecaster learned from.
        predictor_top1 / predictor_recent_top1: top-1 accuracy at steps ``k = 1..K``, over
            every scored prediction / over the latest window of them.
    """

    policy: str
    scheduler: str
    predictor: str
    predictor_workflows_learned: int = 0
    predictor_top1: tuple[float, ...] = ()
    predictor_recent_top1: tuple[float, ...] = ()


def serving(runtime: Any) -> Serving:
    """Return :class:`Serving` for a running :class:`~pbkv.live.session.Runtime`."""
    predictor = runtime.predictor
    chain = [f.name for f in predictor.chain] if predictor is not None else []
    accuracy = predictor.online_accuracy() if predictor is not None else None
    return Serving(
        policy=runtime.kv.config.policy,
        scheduler=getattr(getattr(runtime.engine, "scheduler", None), "name", "") or "-",
        predictor=" > ".join(chain) or "none",
        predictor_workflows_learned=accuracy.workflows if accuracy is not None else 0,
        predictor_top1=accuracy.top1 if accuracy is not None else (),
        predictor_recent_top1=accuracy.recent_top1 if accuracy is not None else (),
    )


def _builtins(value: Any) -> Any:
    """Return ``value`` as plain data, Structs' hit-rate properties included."""
    if _is_record(value):
        return {name: _builtins(leaf) for name, leaf in _leaves(value)}
    if isinstance(value, Mapping):
        return {str(k): _builtins(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_builtins(v) for v in value]
    return msgspec.to_builtins(value)


def snapshot(
    *,
    model: str,
    runtime_stats: Any,
    sessions: Any,
    workflows: list[Any],
    http: HTTPCounters,
    served: Serving | None = None,
) -> dict[str, Any]:
    """Return the whole statistics document.

    Args:
        model: the served model name.
        served: the policy, scheduler and predictor in use (:func:`serving`).
        runtime_stats: ``runtime.statistics()`` (a msgspec Struct).
        sessions: the session registry's statistics (a msgspec Struct).
        workflows: recent workflow records (msgspec Structs).
        http: the server's HTTP counters.
    """
    return {
        "model": model,
        "serving": _builtins(served) if served is not None else None,
        "runtime": _builtins(runtime_stats),
        "sessions": _builtins(sessions),
        "http": http.snapshot(),
        "workflows": _builtins(workflows),
    }


_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _metric(path: tuple[str, ...]) -> str:
    return _NAME.sub("_", "_".join(("pbkv", *path)))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _is_record(value: Any) -> bool:
    return isinstance(value, msgspec.Struct) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def _leaves(value: Any) -> Iterator[tuple[str, Any]]:
    """Yield (field, value) of a Struct or dataclass record, hit-rate properties included."""
    if isinstance(value, msgspec.Struct):
        names = tuple(value.__struct_fields__)
    else:
        names = tuple(f.name for f in dataclasses.fields(value))
    for name in names:
        yield name, getattr(value, name)
    for rate in _RATES:
        if hasattr(value, rate) and rate not in names:
            yield rate, getattr(value, rate)


_RATES = ("gpu_hit_rate", "host_hit_rate")


def _samples(path: tuple[str, ...], value: Any) -> Iterator[tuple[str, str, float]]:
    """Yield (metric, labels, value) for each numeric leaf under ``value``.

    A Struct's fields extend the metric name; a mapping of numbers is one metric with a
    ``key`` label per entry; strings and other mappings are left out.
    """
    if isinstance(value, bool | int | float):
        yield _metric(path), "", float(value)
    elif _is_record(value):
        for name, leaf in _leaves(value):
            yield from _samples((*path, name), leaf)
    elif isinstance(value, Mapping) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    ):
        for k, v in value.items():
            yield _metric(path), f'{{key="{_label(str(k))}"}}', float(v)


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def prometheus_text(
    *, runtime_stats: Any, sessions: Any, http: HTTPCounters, served: Serving | None = None
) -> str:
    """Return the numeric statistics in Prometheus text format (gauges, one per leaf).

    With ``served``: ``pbkv_serving_info{policy,scheduler,predictor} 1`` and the
    predictor's top-1 accuracy per step ``k`` (``pbkv_predictor_top1{k="1"}``; none
    before its first scored prediction).

    Args:
        runtime_stats: ``runtime.statistics()`` (a msgspec Struct).
        sessions: the session registry's statistics (a msgspec Struct).
        http: the server's HTTP counters.
    """
    lines = ["# TYPE pbkv_http_responses counter"]
    if served is not None:
        lines.append("# TYPE pbkv_serving_info gauge")
        lines.append(
            f'pbkv_serving_info{{policy="{_label(served.policy)}",'
            f'scheduler="{_label(served.scheduler)}",predictor="{_label(served.predictor)}"}} 1'
        )
        lines.append("# TYPE pbkv_predictor_workflows_learned gauge")
        lines.append(f"pbkv_predictor_workflows_learned {served.predictor_workflows_learned}")
        for name, rates in (
            ("pbkv_predictor_top1", served.predictor_top1),
            ("pbkv_predictor_recent_top1", served.predictor_recent_top1),
        ):
            measured = [(k, r) for k, r in enumerate(rates, 1) if r == r]  # not nan
            if measured:
                lines.append(f"# TYPE {name} gauge")
                lines.extend(f'{name}{{k="{k}"}} {_number(r)}' for k, r in measured)
    for (route, status), n in sorted(http.responses.items()):
        lines.append(f'pbkv_http_responses{{route="{_label(route)}",status="{status}"}} {n}')
    seen: set[str] = set()
    sections = (
        ("runtime", runtime_stats),
        ("sessions", sessions),
        ("http", {"disconnects": http.disconnects, "in_flight": http.in_flight}),
    )
    for top, section in sections:
        items = section.items() if isinstance(section, Mapping) else None
        samples = (
            (s for k, v in items for s in _samples((top, k), v))
            if items is not None
            else _samples((top,), section)
        )
        for name, labels, value in samples:
            if name not in seen:
                seen.add(name)
                lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name}{labels} {_number(value)}")
    return "\n".join(lines) + "\n"
