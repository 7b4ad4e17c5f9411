"""Online agent forecaster: learns each app's (and tenant's) agent chain as it serves (§7.5).

The default predictor of ``policy="pbkv"``: it needs no training run. One model per
``(app, tenant)`` counts which agent (or ``END``) follows each context of the last ``m``
agents (``m = 1..order``) in the workflows it has seen, and estimates the next-step
distribution by Witten–Bell interpolation (Witten & Bell, IEEE Trans. Inf. Theory 1991;
as used for n-gram language models)::

    P(x | c) = (N(c, x) + T(c) · P(x | c')) / (N(c) + T(c))

where ``c'`` is ``c`` without its oldest agent, ``N(c, x)`` counts ``c -> x``, ``N(c)``
their sum and ``T(c)`` the distinct ``x`` seen after ``c``. Below the order-1 context the
base distribution is the app's declared edges out of the current agent (a graph app's
warm start, fan-out and joins included, uniform over the successors), else every
observed transition pooled, else uniform over the known agents and ``END``. Agents never
seen are learned (added to the app's vocabulary) rather than refused, up to a bound.

A K-step forecast rolls the distribution over order-n contexts forward, reporting each
step conditional on the workflow being alive before it (:mod:`pbkv.predictor.base`).

It learns as workflows run: each new agent a workflow calls is counted as it is called,
and ``END`` when the workflow ends. Accuracy is measured prequentially (test, then
train): at every step the model's top-1 for the next ``k = 1..K`` steps is kept, and
scored against what ran (``END`` included) when that step comes, before it is counted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pbkv.predictor.base import Forecast, WorkflowState
from pbkv.predictor.trace import END

MAX_ORDER = 3
_END = -1
"""``END``'s key in the transition counts (its column is ``len(agents)``)."""

Context = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OnlineAccuracy:
    """Top-1 accuracy of the online forecaster, scored before it learns from each workflow.

    Attributes:
        workflows: ended workflows learned from.
        predictions: scored predictions per step ``k = 1..K`` (cumulative).
        top1: cumulative top-1 accuracy per ``k`` (``nan`` before any prediction).
        recent_top1: top-1 accuracy per ``k`` over the latest ``window`` predictions.
    """

    workflows: int
    predictions: tuple[int, ...]
    top1: tuple[float, ...]
    recent_top1: tuple[float, ...]


class _Run:
    """A running workflow's learning state: steps counted, predictions not yet scored."""

    __slots__ = ("seen", "pending")

    def __init__(self) -> None:
        self.seen = 0
        self.pending: dict[int, list[tuple[int, str]]] = {}  # step -> [(k, top-1 agent)]


class _AppModel:
    """The counts of one ``(app, tenant)``: a growing vocabulary and context counts."""

    def __init__(self, agents: Sequence[str], prior: dict[str, tuple[str, ...]]) -> None:
        self.agents: list[str] = []
        self.index: dict[str, int] = {}
        self.prior_names = prior
        self.counts: dict[Context, dict[int, float]] = {}
        self.rolls: dict[Context, np.ndarray] = {}
        self.conditionals: dict[Context, np.ndarray] = {}
        for agent in agents:
            self.add(agent)

    def add(self, agent: str) -> int:
        column = self.index.get(agent)
        if column is None:
            column = self.index[agent] = len(self.agents)
            self.agents.append(agent)
            self.rolls.clear()
            self.conditionals.clear()
        return column

    def changed(self) -> None:
        self.rolls.clear()
        self.conditionals.clear()


class OnlineMarkovForecaster:
    """An order-n agent chain per app and tenant, learned from the live event stream.

    It is fed by the runtime: :meth:`forecast_each` answers the PredictorActor's batches,
    :meth:`observe_step` sees each workflow's path grow (every forecast request carries
    it), :meth:`observe` its end (``end`` or ``recursion_limit``), and
    :meth:`warm_start` gives a graph app's declared edges.
    Memory is bounded: at most ``max_models`` models (least recently used dropped), each
    at most ``max_agents`` agents (a path naming more gets no forecast) and
    ``max_contexts`` counted contexts (past it only new order-1 contexts are counted).

    Args:
        horizon: ``K``, steps forecast.
        order: ``n``, the longest context, 1 to 3.
        window: predictions the ``recent_top1`` accuracy averages over.
        max_models / max_agents / max_contexts: the memory bounds above.
        max_running: running workflows whose learning state is kept (least recently
            seen dropped: a workflow that never ends does not hold memory for ever).

    Raises:
        ValueError: a bound below 1 or an ``order`` outside 1..3.
    """

    name = "online"
    agents: tuple[str, ...] = ()
    """Empty: the vocabulary is per app and grows; each forecast carries its own."""

    def __init__(
        self,
        *,
        horizon: int = 3,
        order: int = 2,
        window: int = 1000,
        max_models: int = 256,
        max_agents: int = 512,
        max_contexts: int = 65_536,
        max_running: int = 65_536,
    ) -> None:
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order must be 1 to {MAX_ORDER}, got {order}")
        for name, value in (
            ("horizon", horizon),
            ("window", window),
            ("max_models", max_models),
            ("max_agents", max_agents),
            ("max_contexts", max_contexts),
            ("max_running", max_running),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.horizon = horizon
        self.order = order
        self.max_models = max_models
        self.max_agents = max_agents
        self.max_contexts = max_contexts
        self._models: OrderedDict[tuple[str, str], _AppModel] = OrderedDict()
        self._apps: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {}
        self._workflows = 0
        self._hits = [0] * horizon
        self._scored = [0] * horizon
        self._recent = [deque[bool](maxlen=window) for _ in range(horizon)]
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self.max_running = max_running

    # -- feeding -----------------------------------------------------------------------

    def warm_start(self, app: str, agents: Sequence[str], edges: Iterable[tuple[str, str]]) -> None:
        """Start ``app``'s models from its declared call graph.

        Args:
            app: the app name workflows report (``WorkflowState.app``).
            agents: its agents, in a fixed order.
            edges: ``(source, target)`` transitions it declares; ``target`` may be
                ``END``. A fan-out's branches and joins are edges like any other.

        Mutates: forgets ``app``'s models learned so far (every tenant's).
        """
        successors: dict[str, list[str]] = {}
        for source, target in edges:
            successors.setdefault(source, [])
            if target not in successors[source]:
                successors[source].append(target)
        self._apps[app] = (tuple(agents), {a: tuple(s) for a, s in successors.items()})
        for key in [k for k in self._models if k[0] == app]:
            del self._models[key]

    def observe_step(
        self, workflow_id: str, app: str, path: Sequence[str], *, tenant: str = ""
    ) -> None:
        """Learn from a running workflow's path as it grows (each new agent it calls).

        For each agent not seen before: first score the top-1 predictions made earlier
        for this step (at ``k`` steps ahead, from the model as it was then), then count
        the transition into it, then predict the next ``K`` steps from the new prefix
        (kept to be scored when they come). Repeats of a path already seen change
        nothing.

        Args:
            workflow_id: the workflow (its pending predictions and counted length).
            app / tenant: whose model learns.
            path: the agents the workflow ran so far, in order.

        Mutates: the model's counts and vocabulary; the accuracy counters; the pending
        predictions of ``workflow_id``.
        """
        model = self._model(app, tenant)
        run = self._runs.get(workflow_id)
        if run is None:
            run = self._runs[workflow_id] = _Run()
            while len(self._runs) > self.max_running:
                self._runs.popitem(last=False)
        self._runs.move_to_end(workflow_id)
        for i in range(run.seen, len(path)):
            agent = path[i]
            self._score_due(run, i, agent)
            if agent not in model.index and len(model.agents) < self.max_agents:
                model.add(agent)
            if i:
                self._count_into(model, path[:i], agent)
            self._predict(model, run, path[: i + 1], i)
        run.seen = max(run.seen, len(path))

    def observe(
        self, app: str, path: Sequence[str], *, tenant: str = "", workflow_id: str = ""
    ) -> None:
        """Learn from one ended workflow: its steps not yet seen (:meth:`observe_step`),
        then ``END`` after its last agent (scored first, then counted).

        Args:
            app / tenant: whose model learns.
            path: the agents the workflow ran, in order (empty: ignored).
            workflow_id: the id its steps were observed under; ``""``: none were.

        Mutates: the model's counts and vocabulary; the accuracy counters.
        """
        if not path:
            self._runs.pop(workflow_id, None)
            return
        key = workflow_id or f"\0ended-{self._workflows}"
        self.observe_step(key, app, path, tenant=tenant)
        run = self._runs.pop(key)
        model = self._model(app, tenant)
        self._score_due(run, len(path), END)
        self._count_into(model, path, END)
        self._workflows += 1

    def _score_due(self, run: _Run, index: int, actual: str) -> None:
        """Score the predictions made earlier for step ``index`` (then forget them)."""
        for k, predicted in run.pending.pop(index, ()):
            hit = predicted == actual
            self._hits[k - 1] += hit
            self._scored[k - 1] += 1
            self._recent[k - 1].append(hit)

    def _count_into(self, model: _AppModel, history: Sequence[str], nxt: str) -> None:
        context = self._context(model, history)
        column = _END if nxt == END else model.index.get(nxt)
        if context is None or column is None:
            return  # past the vocabulary bound: not counted
        self._count(model, context, column)
        model.changed()

    def _predict(self, model: _AppModel, run: _Run, prefix: Sequence[str], index: int) -> None:
        """Keep the top-1 of the next ``K`` steps after ``prefix`` (its last agent is step
        ``index``), to be scored when each comes; a prefix the model cannot forecast
        (past its vocabulary bound) predicts nothing, and those steps score as misses."""
        context = self._context(model, prefix)
        names = (*model.agents, END)
        for k in range(1, self.horizon + 1):
            if context is None:
                guess = ""
            else:
                rows = model.rolls.get(context)
                if rows is None:
                    rows = model.rolls[context] = self._roll(model, context)
                guess = names[int(np.argmax(rows[k - 1]))]
            run.pending.setdefault(index + k, []).append((k, guess))

    # -- forecasting -------------------------------------------------------------------

    def forecast_each(self, states: Sequence[WorkflowState]) -> list[Forecast | None]:
        """Forecast each state with its own app's model and vocabulary.

        Returns:
            Per state, a :class:`Forecast` whose ``probabilities`` has shape
            ``(K, len(agents) + 1)`` (rows sum to 1, ``END`` last), or ``None`` when its
            path names more agents than the model's bound allows.

        Raises:
            ValueError: a state's path is empty.

        Mutates: unknown agents of a path join its model's vocabulary.
        """
        out: list[Forecast | None] = []
        for state in states:
            if not state.path:
                raise ValueError("path must hold at least the current agent")
            model = self._model(state.app, state.tenant)
            for agent in state.path[-self.order :]:
                if agent not in model.index and len(model.agents) < self.max_agents:
                    model.add(agent)
            context = self._context(model, state.path)
            if context is None:
                out.append(None)
                continue
            rolled = model.rolls.get(context)
            if rolled is None:
                rolled = model.rolls[context] = self._roll(model, context)
            out.append(Forecast(rolled, tuple(model.agents)))
        return out

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Refuse: the vocabulary is per app; use :meth:`forecast_each`.

        Raises:
            TypeError: always.
        """
        raise TypeError("OnlineMarkovForecaster forecasts per app: call forecast_each")

    def accuracy(self) -> OnlineAccuracy:
        """Return the prequential top-1 accuracy so far. Does not modify anything."""
        return OnlineAccuracy(
            self._workflows,
            tuple(self._scored),
            tuple(
                h / n if n else float("nan") for h, n in zip(self._hits, self._scored, strict=True)
            ),
            tuple(sum(r) / len(r) if r else float("nan") for r in self._recent),
        )

    def known_agents(self, app: str, tenant: str = "") -> tuple[str, ...]:
        """Return the vocabulary of ``(app, tenant)``'s model (empty if it has none)."""
        model = self._models.get((app, tenant))
        return tuple(model.agents) if model is not None else ()

    # -- the chain ---------------------------------------------------------------------

    def _model(self, app: str, tenant: str) -> _AppModel:
        key = (app, tenant)
        model = self._models.get(key)
        if model is None:
            agents, prior = self._apps.get(app, ((), {}))
            model = self._models[key] = _AppModel(agents, prior)
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)
        self._models.move_to_end(key)
        return model

    def _context(self, model: _AppModel, path: Sequence[str]) -> Context | None:
        context = tuple(model.index.get(a, -2) for a in path[-self.order :])
        return None if -2 in context else context

    def _count(self, model: _AppModel, history: Context, nxt: int) -> None:
        for m in range(1, len(history) + 1):
            key = history[len(history) - m :]
            counts = model.counts.get(key)
            if counts is None:
                if m > 1 and len(model.counts) >= self.max_contexts:
                    continue
                counts = model.counts[key] = {}
            counts[nxt] = counts.get(nxt, 0.0) + 1.0
        pooled = model.counts.setdefault((), {})
        pooled[nxt] = pooled.get(nxt, 0.0) + 1.0

    def _conditional(self, model: _AppModel, context: Context) -> np.ndarray:
        """``P(next | context)`` over ``model.agents`` and ``END`` (last), Witten–Bell."""
        cached = model.conditionals.get(context)
        if cached is not None:
            return cached
        p = self._base(model, context[-1])
        for m in range(1, len(context) + 1):
            counts = model.counts.get(context[len(context) - m :])
            if not counts:
                continue
            observed = np.zeros(len(model.agents) + 1)
            for column, n in counts.items():
                observed[column] += n  # _END is -1: the last column
            total, distinct = observed.sum(), float(len(counts))
            p = (observed + distinct * p) / (total + distinct)
        model.conditionals[context] = p
        return p

    def _base(self, model: _AppModel, current: int) -> np.ndarray:
        """The distribution below every context: declared edges, pooled counts, uniform."""
        width = len(model.agents) + 1
        successors = model.prior_names.get(model.agents[current], ())
        base = np.zeros(width)
        for name in successors:
            column = width - 1 if name == END else model.index.get(name)
            if column is not None:
                base[column] = 1.0
        if base.sum() > 0:
            return base / base.sum()
        pooled = model.counts.get(())
        if pooled:
            for column, n in pooled.items():
                base[column] += n
            return base / base.sum()
        return np.full(width, 1.0 / width)

    def _roll(self, model: _AppModel, start: Context) -> np.ndarray:
        """Roll the context distribution ``K`` steps forward from ``start``."""
        width = len(model.agents) + 1
        rows = np.zeros((self.horizon, width))
        contexts: dict[Context, float] = {start: 1.0}
        for k in range(self.horizon):
            marginal = np.zeros(width)
            following: dict[Context, float] = {}
            for context, mass in contexts.items():
                p = self._conditional(model, context)
                marginal += mass * p
                for agent in np.flatnonzero(p[:-1]):
                    key = (*context, int(agent))[-self.order :]
                    following[key] = following.get(key, 0.0) + mass * float(p[agent])
            alive = marginal.sum()
            if alive > 0:
                rows[k] = marginal / alive
            else:
                rows[k, -1] = 1.0
            contexts = following
        return rows
