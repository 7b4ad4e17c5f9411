"""Place each request of a workflow on a replica: round-robin, Dynamo's KV routing, KV
routing with session affinity, and pbkv's workflow placement (DESIGN §7.6).

Plain synchronous code (no trio, no Dynamo import): the Dynamo router service and the
multi-replica study (:mod:`pbkv.bench.placement`) call the same classes. A caller hands
:meth:`Placement.place` what Dynamo's router knows of each live replica for this request
(:class:`ReplicaView`: cached overlap from KV events, blocks in flight), tells it when
the request ends (:meth:`Placement.done`) and when the workflow ends
(:meth:`Placement.finish`, Dynamo's ``session_final``).

Dynamo's KV router (``docs/router/router_design.md`` upstream, 1.6.1) picks the replica
of least ``overlap_weight * prefill_blocks + active_blocks``, where ``prefill_blocks`` is
the request's blocks not cached there (host-tier blocks count
``host_hit_weight`` of a device block) and ``active_blocks`` the blocks of requests in
flight there, the request's own included. :class:`KvPlacement` is that rule;
:class:`KvAffinityPlacement` adds ``--router-session-affinity-ttl-secs`` (a workflow's
first request placed by it, then held there). :class:`PbkvPlacement` pins each workflow
to a replica chosen by the context its live workflows hold, and moves it only when its
predicted reuse there is worth less than the load gap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pbkv.predictor.base import WorkflowState
from pbkv.predictor.online import OnlineMarkovForecaster

HOST_HIT_WEIGHT = 0.75
"""What a host-tier cached block is worth against a device one (Dynamo 1.6.1's default
``--router-host-cache-hit-weight``)."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the router knows of one live replica when placing one request.

    Args:
        replica: the replica's index (or Dynamo worker id).
        cached_gpu_blocks: leading blocks of the request's prompt cached on its GPU.
        cached_host_blocks: the blocks after those cached only in its host tier.
        active_blocks: blocks of the requests in flight there (prompt + expected
            output), not counting this one.
    """

    replica: int
    cached_gpu_blocks: int = 0
    cached_host_blocks: int = 0
    active_blocks: int = 0

    def overlap_blocks(self, host_hit_weight: float = HOST_HIT_WEIGHT) -> float:
        """Return the request's cached blocks here, host blocks weighted."""
        return self.cached_gpu_blocks + host_hit_weight * self.cached_host_blocks


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """One request to place.

    Args:
        workflow_id: the workflow (Dynamo session id) it belongs to.
        agent: the calling agent (``x-dynamo-meta-agent``), for pbkv's forecast.
        prompt_blocks: blocks of its prompt.
        output_blocks: blocks it is expected to decode (``agent_hints.osl``).
        app: the app whose agent chain the forecast learns (one per deployment is fine).
    """

    workflow_id: str
    agent: str
    prompt_blocks: int
    output_blocks: int = 0
    app: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes.

    Attributes:
        replica: the chosen replica.
        moved: the workflow ran its previous request on another replica.
    """

    replica: int
    moved: bool


@dataclass(slots=True)
class PlacementStatistics:
    """What a placement did: requests placed, requests that changed replica within a
    workflow (``switches``), and workflows that ran on more than one replica."""

    placed: int = 0
    switches: int = 0
    moved_workflows: int = 0


class Placement(Protocol):
    """A placement policy: one decision per request.

    ``place`` mutates the policy's own state (pins, round-robin cursor); it never sees
    the replicas' caches except through the views it is given.
    """

    name: str

    def place(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> Decision:
        """Return the replica ``request`` runs on, one of ``replicas``.

        Raises:
            ValueError: ``replicas`` is empty.
        """
        ...

    def done(self, request: PlacementRequest, replica: int, context_blocks: int) -> None:
        """Note that ``request`` ended on ``replica`` with ``context_blocks`` blocks
        (prompt + output) that its workflow's next request may reuse there."""
        ...

    def finish(self, workflow_id: str) -> None:
        """Forget ``workflow_id``: it ended (Dynamo's ``session_final``)."""
        ...

    def statistics(self) -> PlacementStatistics: ...


@dataclass(slots=True)
class _Tracked:
    """A workflow's placement so far: last replica, replicas seen, agents called."""

    replica: int
    replicas: set[int]
    path: list[str]
    context_blocks: int = 0


class _Base:
    """Bookkeeping shared by every policy: switches and moved workflows, per workflow."""

    name = ""

    def __init__(self) -> None:
        self._workflows: dict[str, _Tracked] = {}
        self._stats = PlacementStatistics()

    def _record(self, request: PlacementRequest, replica: int) -> Decision:
        tracked = self._workflows.get(request.workflow_id)
        self._stats.placed += 1
        if tracked is None:
            self._workflows[request.workflow_id] = _Tracked(replica, {replica}, [request.agent])
            return Decision(replica, False)
        moved = tracked.replica != replica
        if moved:
            self._stats.switches += 1
            if len(tracked.replicas) == 1:
                self._stats.moved_workflows += 1
        tracked.replica = replica
        tracked.replicas.add(replica)
        tracked.path.append(request.agent)
        return Decision(replica, moved)

    def done(self, request: PlacementRequest, replica: int, context_blocks: int) -> None:
        tracked = self._workflows.get(request.workflow_id)
        if tracked is not None and tracked.replica == replica:
            tracked.context_blocks = context_blocks

    def finish(self, workflow_id: str) -> None:
        self._workflows.pop(workflow_id, None)

    def statistics(self) -> PlacementStatistics:
        s = self._stats
        return PlacementStatistics(s.placed, s.switches, s.moved_workflows)


def _check(replicas: Sequence[ReplicaView]) -> None:
    if not replicas:
        raise ValueError("replicas must name at least one live replica")


class RoundRobinPlacement(_Base):
    """Each request to the next replica in turn (Dynamo ``--router-mode round-robin``)."""

    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._turn = itertools.count()

    def place(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> Decision:
        _check(replicas)
        return self._record(request, replicas[next(self._turn) % len(replicas)].replica)


def kv_cost(
    request: PlacementRequest,
    view: ReplicaView,
    *,
    overlap_weight: float = 1.0,
    host_hit_weight: float = HOST_HIT_WEIGHT,
) -> float:
    """Return Dynamo's KV-router cost of running ``request`` on ``view``'s replica:
    ``overlap_weight * prefill_blocks + active_blocks`` (the request's own included)."""
    prefill = max(0.0, request.prompt_blocks - view.overlap_blocks(host_hit_weight))
    active = view.active_blocks + request.prompt_blocks + request.output_blocks
    return overlap_weight * prefill + active


def _least(
    replicas: Sequence[ReplicaView], cost: Callable[[ReplicaView], float], rng: np.random.Generator
) -> ReplicaView:
    """Return the replica of least ``cost``, ties broken at random (Dynamo's temperature 0)."""
    costs = [cost(v) for v in replicas]
    best = min(costs)
    tied = [v for v, c in zip(replicas, costs, strict=True) if c <= best + 1e-9]
    return tied[int(rng.integers(len(tied)))] if len(tied) > 1 else tied[0]


class KvPlacement(_Base):
    """Dynamo's KV router: least :func:`kv_cost` per request (``--router-mode kv``).

    Args:
        overlap_weight: ``--kv-overlap-score-weight`` (default 1).
        host_hit_weight: ``--router-host-cache-hit-weight`` (default 0.75).
        seed: seeds the tie-break.
    """

    name = "kv"

    def __init__(
        self,
        *,
        overlap_weight: float = 1.0,
        host_hit_weight: float = HOST_HIT_WEIGHT,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.overlap_weight = overlap_weight
        self.host_hit_weight = host_hit_weight
        self._rng = np.random.default_rng(seed)

    def _cost(self, request: PlacementRequest) -> Callable[[ReplicaView], float]:
        return lambda v: kv_cost(
            request, v, overlap_weight=self.overlap_weight, host_hit_weight=self.host_hit_weight
        )

    def place(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> Decision:
        _check(replicas)
        return self._record(request, _least(replicas, self._cost(request), self._rng).replica)


class KvAffinityPlacement(KvPlacement):
    """Dynamo's KV router with session affinity: a workflow's first request is placed by
    :func:`kv_cost`, the rest follow it while that replica lives
    (``--router-session-affinity-ttl-secs``, hard mode)."""

    name = "kv-affinity"

    def place(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> Decision:
        _check(replicas)
        tracked = self._workflows.get(request.workflow_id)
        if tracked is not None and any(v.replica == tracked.replica for v in replicas):
            return self._record(request, tracked.replica)
        return super().place(request, replicas)


@dataclass(frozen=True, slots=True)
class PbkvPlacementConfig:
    """The knobs of :class:`PbkvPlacement`.

    Args:
        load_weight: blocks of predicted reuse one block of load gap is worth.
        host_hit_weight: what a host-tier cached block is worth against a device one.
        horizon / gamma: steps forecast and their decay (as the cache score, §5.3).
    """

    load_weight: float = 0.05
    host_hit_weight: float = HOST_HIT_WEIGHT
    horizon: int = 3
    gamma: float = 0.8


class PbkvPlacement(_Base):
    """pbkv's workflow placement: pin each workflow, move it only when worth it.

    A workflow's first request goes to the replica whose live pinned workflows hold the
    least context (what will come back to it, not only what runs now), ties broken by
    :func:`kv_cost`. Each later request stays on the pinned replica ``p`` unless, for the
    replica ``q`` of least :func:`kv_cost` among the others,

        load_weight * (load(p) - load(q)) > overlap(p) - overlap(q) + reuse(p) - reuse(q)

    where ``load`` is a replica's blocks in flight plus its pinned workflows' context,
    ``overlap`` the request's cached blocks there, and ``reuse(r)`` the workflow's
    predicted reuse of its context on ``r``: paper Eq. 2 over the workflow's own
    contexts, ``sum_k gamma^(k-1) s^(k) sum_a P^(k)(a) * context(a, r)``, with
    ``context(a, r)`` the blocks agent ``a``'s last call left on ``r`` and ``P^(k)``,
    ``s^(k)`` pbkv's online forecast of the workflow's next agents and survival. A
    replica that left the live set releases its workflows, placed afresh.

    Args:
        config: the knobs (:class:`PbkvPlacementConfig`).
        forecaster: the agent chain it forecasts with; default a fresh
            :class:`~pbkv.predictor.online.OnlineMarkovForecaster` learning from each
            finished workflow's path.
        seed: seeds the tie-break.
    """

    name = "pbkv"

    def __init__(
        self,
        config: PbkvPlacementConfig | None = None,
        *,
        forecaster: OnlineMarkovForecaster | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.config = config or PbkvPlacementConfig()
        self.forecaster = forecaster or OnlineMarkovForecaster(horizon=self.config.horizon)
        # workflow -> (replica, agent) -> context blocks that agent's last call left there
        self._contexts: dict[str, dict[tuple[int, str], int]] = {}
        self._apps: dict[str, str] = {}
        self._rng = np.random.default_rng(seed)

    def warm_start(self, app: str, agents: Sequence[str], edges: Sequence[tuple[str, str]]) -> None:
        """Start the forecast of ``app`` from its declared call graph."""
        self.forecaster.warm_start(app, agents, edges)

    def bound_blocks(self, replica: int) -> int:
        """Return the context blocks the live workflows pinned to ``replica`` left there."""
        return sum(
            blocks
            for wf, tracked in self._workflows.items()
            if tracked.replica == replica
            for (r, _), blocks in self._contexts.get(wf, {}).items()
            if r == replica
        )

    def predicted_reuse(self, workflow_id: str, path: Sequence[str], replica: int) -> float:
        """Return the workflow's predicted reuse of its context on ``replica``, in blocks
        (paper Eq. 2 over its own contexts; 0 without a forecast)."""
        contexts = {
            a: b for (r, a), b in self._contexts.get(workflow_id, {}).items() if r == replica
        }
        if not contexts or not path:
            return 0.0
        state = WorkflowState(workflow_id, self._apps.get(workflow_id, ""), tuple(path))
        forecast = self.forecaster.forecast_each([state])[0]
        if forecast is None:
            return 0.0
        columns = [
            (forecast.agents.index(a), b) for a, b in contexts.items() if a in forecast.agents
        ]
        alive, total = 1.0, 0.0
        for k, row in enumerate(forecast.probabilities):
            total += self.config.gamma**k * alive * sum(float(row[i]) * b for i, b in columns)
            alive *= 1.0 - float(row[-1])
        return total

    def place(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> Decision:
        _check(replicas)
        self._apps[request.workflow_id] = request.app
        tracked = self._workflows.get(request.workflow_id)
        live = {v.replica: v for v in replicas}
        if tracked is None or tracked.replica not in live:
            return self._hold(request, self._first(request, replicas))
        pinned = live[tracked.replica]
        others = [v for v in replicas if v.replica != pinned.replica]
        if others:
            best = _least(others, lambda v: self._kv_cost(request, v), self._rng)
            if self._worth_moving(request, tracked, pinned, best):
                return self._hold(request, best.replica)
        return self._hold(request, pinned.replica)

    def _hold(self, request: PlacementRequest, replica: int) -> Decision:
        """Record the decision; the prompt counts as the workflow's context there at once
        (so workflows arriving together spread before any of them has finished a call)."""
        decision = self._record(request, replica)
        contexts = self._contexts.setdefault(request.workflow_id, {})
        key = (replica, request.agent)
        contexts[key] = max(contexts.get(key, 0), request.prompt_blocks)
        return decision

    def _first(self, request: PlacementRequest, replicas: Sequence[ReplicaView]) -> int:
        bound = {v.replica: self.bound_blocks(v.replica) for v in replicas}
        least = min(bound.values())
        emptiest = [v for v in replicas if bound[v.replica] == least]
        return _least(emptiest, lambda v: self._kv_cost(request, v), self._rng).replica

    def _kv_cost(self, request: PlacementRequest, view: ReplicaView) -> float:
        return kv_cost(request, view, host_hit_weight=self.config.host_hit_weight)

    def _worth_moving(
        self, request: PlacementRequest, tracked: _Tracked, pinned: ReplicaView, best: ReplicaView
    ) -> bool:
        weight = self.config.host_hit_weight
        wf, path = request.workflow_id, tracked.path
        stay = pinned.overlap_blocks(weight) - best.overlap_blocks(weight)
        stay += self.predicted_reuse(wf, path, pinned.replica)
        stay -= self.predicted_reuse(wf, path, best.replica)
        gap = (pinned.active_blocks + self.bound_blocks(pinned.replica)) - (
            best.active_blocks + self.bound_blocks(best.replica)
        )
        return self.config.load_weight * gap > stay

    def done(self, request: PlacementRequest, replica: int, context_blocks: int) -> None:
        super().done(request, replica, context_blocks)
        if request.workflow_id in self._workflows:
            contexts = self._contexts.setdefault(request.workflow_id, {})
            contexts[(replica, request.agent)] = context_blocks

    def finish(self, workflow_id: str) -> None:
        tracked = self._workflows.get(workflow_id)
        if tracked is not None:
            self.forecaster.observe(self._apps.get(workflow_id, ""), tracked.path)
        self._apps.pop(workflow_id, None)
        self._contexts.pop(workflow_id, None)
        super().finish(workflow_id)


@dataclass(frozen=True, slots=True)
class _Entry:
    make: Callable[[int], Placement]
    summary: str


PLACEMENTS: dict[str, _Entry] = {
    "round-robin": _Entry(lambda seed: RoundRobinPlacement(), "each request to the next replica"),
    "kv": _Entry(lambda seed: KvPlacement(seed=seed), "Dynamo's KV router: overlap + load"),
    "kv-affinity": _Entry(
        lambda seed: KvAffinityPlacement(seed=seed), "Dynamo's KV router + session affinity"
    ),
    "pbkv": _Entry(
        lambda seed: PbkvPlacement(seed=seed), "pin per workflow, move when reuse < load gap"
    ),
}
"""Placement policies by name."""


def make_placement(name: str, *, seed: int = 0) -> Placement:
    """Return a fresh placement policy by name.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    entry = PLACEMENTS.get(name)
    if entry is None:
        raise ValueError(f"unknown placement {name!r}; known: {', '.join(PLACEMENTS)}")
    return entry.make(seed)


@dataclass(slots=True)
class InFlight:
    """Blocks in flight per replica, as Dynamo's router counts its ``active_blocks``:
    added when a request is routed, removed when it ends. Mutated by its methods."""

    blocks: dict[int, int] = field(default_factory=dict)

    def add(self, replica: int, blocks: int) -> None:
        self.blocks[replica] = self.blocks.get(replica, 0) + blocks

    def remove(self, replica: int, blocks: int) -> None:
        left = self.blocks.get(replica, 0) - blocks
        if left < 0:
            raise ValueError(f"replica {replica}: removing {blocks} blocks leaves {left}")
        self.blocks[replica] = left

    def of(self, replica: int) -> int:
        return self.blocks.get(replica, 0)


def blocks_of(tokens: int, block_size: int) -> int:
    """Return the blocks ``tokens`` tokens take (a partial block counts)."""
    return math.ceil(tokens / block_size)
