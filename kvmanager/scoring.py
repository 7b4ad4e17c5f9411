"""PBKV's predicted reuse score, kept current incrementally (paper Eq. 2–4, §5.3).

For node ``c``, active workflows ``W_act(c)`` that touched it, forecast rows ``P_w^(k)``
(conditional per step, see :mod:`pbkv.predictor.base`), access indicator ``A_w(c)``,
survival ``s_w^(k) = prod_{j<k} (1 - P_w^(j)[END])`` and decay ``gamma``::

    Score(c) = sum_{k=1..K} gamma^(k-1) sum_{w in W_act(c)} s_w^(k) (A_w(c) . P_w^(k))
             = sum_{w in W_act(c)} sum_{a in A_w(c)} u_w[a],
    u_w[a]   = sum_k gamma^(k-1) s_w^(k) P_w^(k)[a].

So a forecast for ``w`` changes only the nodes ``w`` touched, each by
``sum_{a in A_w(c)} (u_new[a] - u_old[a])``; that is the whole refresh.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter, mul, sub

import numpy as np

from pbkv.kvmanager.node import NO_WORKFLOW, Node

ROW_SUM_TOLERANCE = 1e-4
"""How far a forecast row's sum may be from 1 (float32 models round; more is a bug)."""
_SUM_LOW, _SUM_HIGH = 1.0 - ROW_SUM_TOLERANCE / 2, 1.0 + ROW_SUM_TOLERANCE / 2
"""Row sums in this range are accepted without numpy (see :func:`_plainly_valid`)."""
ENDED_MEMORY = 65_536
"""Terminated workflow ids a :class:`ScoreBoard` remembers, for late touches."""
CALL_SHARE_DECAY = 0.3
"""Weight of the latest call in a workflow's call shares (:meth:`ScoreBoard.note_invocation`)."""
MISS_RATE_DECAY = 0.02
"""Weight of the latest call in :attr:`ScoreBoard.miss_rate`'s moving average."""
TAIL_MAX_STEPS = 64.0
"""Most discounted steps past the horizon the tail counts (:func:`beyond_horizon_mass`);
reached only as ``gamma (1 - e)`` nears 1 (at ``gamma = 0.8`` the series sums to <= 5)."""
HISTORY_SMOOTHING = 0.05
"""``epsilon`` of the history expert ``share[a] + epsilon`` (:func:`agent_weights`): an
agent the workflow has not called yet keeps part of its forecast."""
EVIDENCE_CAP = 5.0
"""Largest ``|log(Q/P)|`` one call adds to the history's evidence (a call one expert gave
no mass would otherwise settle the question for ever)."""
HISTORY_WEIGHT_PRIOR = 0.1
"""The history's weight before any call is checked (odds 1:9 against it). Once the calls
favour the forecast more than that (log-odds below the prior's) the weight is 0 and the
score is Eq. 2 exactly (ties stay ties). Chosen against 0 and 0.01 at the paper's loads
(``docs/design.md``)."""
_POWERS = 8
"""``gamma**k`` a :class:`ScoreBoard` takes once, for ``k < _POWERS`` (horizons to 7 and
the tail past them)."""
_FLOAT64 = np.dtype(np.float64)
_SIGN_BYTES = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
"""The byte of each float64 of an array's bytes that holds its sign bit."""
PRIOR_EVIDENCE = math.log(HISTORY_WEIGHT_PRIOR / (1.0 - HISTORY_WEIGHT_PRIOR))
"""The prior's log-odds; forgotten evidence decays back to it."""


def validate_forecast(forecast: np.ndarray, n_agents: int) -> np.ndarray:
    """Return ``forecast`` as float64 if it is a well-formed K-step forecast.

    Args:
        forecast: shape ``(K, n_agents + 1)``, ``K >= 1``; END is the last column; each
            row a probability distribution (see :mod:`pbkv.predictor.base`).
        n_agents: the number of agent columns.

    Raises:
        ValueError: the shape does not fit, or a value is not finite, negative, or a
            row does not sum to 1 (within :data:`ROW_SUM_TOLERANCE`); the message says which.
    """
    array = np.asarray(forecast, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] != n_agents + 1:
        raise ValueError(f"forecast shape {array.shape} does not fit {n_agents} agents + END")
    if not np.isfinite(array).all():
        raise ValueError("forecast holds values that are not finite")
    if (array < 0).any():
        raise ValueError(f"forecast holds negative probabilities (min {array.min():.3g})")
    sums = array.sum(axis=1)
    worst = int(np.abs(sums - 1.0).argmax())
    if abs(sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(f"forecast row {worst} sums to {sums[worst]:.6g}; rows must sum to 1")
    return array


def agent_weights(
    forecast: np.ndarray,
    agents: Sequence[str],
    gamma: float,
    call_shares: Mapping[str, float] | None = None,
    tail_weight: float = 1.0,
    history_weight: float = 0.0,
) -> tuple[dict[str, float], dict[str, float]]:
    """Fold a K-step forecast into per-agent reuse weights.

    Past the horizon the forecast says nothing, yet an agent whose next call lies beyond
    step K is often called again. With ``call_shares`` (the workflow's recent share of
    calls per agent, :meth:`ScoreBoard.note_invocation`), each step ``k > K`` is taken to
    call ``a`` with probability ``call_shares[a]`` and to end with the horizon's last END
    probability ``e``, which adds the geometric tail (:func:`beyond_horizon_mass`)::

        tail[a] = tail_weight * call_shares[a] * gamma^K s^(K+1) / (1 - gamma (1 - e))

    So a context just computed never weighs nothing while its workflow runs, and the
    more the forecasts have missed (``tail_weight``), the more the workflow's own call
    history ranks its cache: a weak forecast leans toward recency, not toward zero.

    Within the horizon a forecast can be sure that *some* agent of a kind runs next yet
    unable to say which: markov-1 on a selector group chat that keeps naming one member
    gives every member about 0.22 after the Selector, so the member the chat keeps
    calling ranks with the idle ones, below the Selector's context
    (``docs/design.md`` has the hit rates). With
    ``history_weight = m > 0`` each row is mixed with its history-sharpened row
    (:func:`history_sharpened`)::

        P'^(k) = (1 - m) P^(k) + m Q^(k),   Q^(k)[a] ∝ P^(k)[a] (call_shares[a] + eps)

    which keeps END (so the survival weights) and a row that names one agent, and moves
    a row's mass toward the agents the workflow keeps calling. ``m`` is the posterior
    that ``Q`` predicts this workflow's calls better than ``P``
    (:meth:`ScoreBoard.history_weight`): a sharp forecast keeps Eq. 2 exactly.

    Plain Python over the rows for ``K <= 3`` (a forecast is a few rows of a few agents,
    where each numpy call costs more than the arithmetic); the weights are bit-for-bit
    those of the numpy form ``(gamma^(k-1) s^(k)) @ P`` for every ``K``. A
    :class:`ScoreBoard` computes the same weights with its ``gamma`` powers taken once.

    Args:
        forecast: shape ``(K, len(agents) + 1)``; END is the last column.
        agents: the column names.
        gamma: confidence decay in (0, 1].
        call_shares: per agent, its share of the workflow's recent calls (summing to at
            most 1); ``None`` or empty: no tail (Eq. 2 as the paper writes it).
        tail_weight: scales the tail, in [0, 1] (:attr:`ScoreBoard.miss_rate`).
        history_weight: ``m`` in [0, 1], the weight of the history-sharpened rows (read
            only with ``call_shares``); 0: the rows as forecast.

    Returns:
        ``(u, next_step)``: ``u[a] = sum_k gamma^(k-1) s^(k) P'^(k)[a]`` (Eq. 2–4) plus
        the tail, and the forecast's own step-1 distribution ``P^(1)[a]`` (the
        prefetch value of §5.4).

    Raises:
        ValueError: the forecast is malformed (see :func:`validate_forecast`).
    """
    return _agent_weights(forecast, agents, gamma, (), call_shares, tail_weight, history_weight)


def _agent_weights(
    forecast: np.ndarray,
    agents: Sequence[str],
    gamma: float,
    powers: Sequence[float],
    call_shares: Mapping[str, float] | None,
    tail_weight: float,
    history_weight: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`agent_weights`, with ``powers[k] == gamma**k`` for the ``k`` it holds
    (``gamma**k`` itself past them: the same float either way): :func:`_fold` as dicts."""
    agents = tuple(agents)
    rows = _valid_rows(forecast, len(agents))
    weights = _fold(
        rows, forecast, agents, _positions(agents), gamma, powers, call_shares, tail_weight,
        history_weight,
    )  # fmt: skip
    return dict(zip(agents, weights)), dict(zip(agents, rows[0]))  # noqa: B905 (END left out)


def _positions(agents: tuple[str, ...]) -> dict[str, int]:
    """Return each agent's column.

    Raises:
        ValueError: ``agents`` names an agent twice (its columns would be one weight).
    """
    position = {agent: i for i, agent in enumerate(agents)}
    if len(position) != len(agents):
        raise ValueError(f"agents name an agent twice: {list(agents)}")
    return position


def _valid_rows(forecast: np.ndarray, n_agents: int) -> list[list[float]]:
    """Return a forecast's rows (END last) if it is well formed (:func:`validate_forecast`)."""
    rows = _plainly_valid(forecast, n_agents)
    if rows is None:  # not clearly valid: accepted or refused exactly as before
        rows = validate_forecast(forecast, n_agents).tolist()
    return rows


def _fold(
    rows: list[list[float]],
    forecast: np.ndarray,
    agents: tuple[str, ...],
    position: Mapping[str, int],
    gamma: float,
    powers: Sequence[float],
    call_shares: Mapping[str, float] | None,
    tail_weight: float,
    history_weight: float,
) -> list[float]:
    """Return :func:`agent_weights`' ``u`` as a list in ``agents``' order, then ``0.0``
    (the weight of an agent the forecast does not name: ``u[position.get(a, -1)]``).

    ``rows``: the validated forecast's (:func:`_valid_rows`); ``position``: each
    agent's column (:func:`_positions`). The default horizon (``K = 3``, with
    ``powers``) folds as :func:`_fold_default` does.
    """
    n = len(agents)
    if len(rows) == 3 and len(powers) >= 3:
        weights = _fold_default_rows(rows, n, powers)
    else:
        weights = _fold_rows(rows, np.asarray(forecast, dtype=np.float64), gamma, powers)
        del weights[n:]  # the END column, where the fold took it
        weights.append(0.0)
    if call_shares:
        _extend(
            weights, rows, agents, position, gamma, powers, call_shares, tail_weight, history_weight
        )
    return weights


def _fold_default(
    forecast: np.ndarray, n_agents: int, powers: Sequence[float]
) -> tuple[list[list[float]], list[float]] | None:
    """Return the rows and the Eq. 2 weights (as :func:`_fold` without shares) of a
    default-horizon forecast that is clearly valid, else ``None`` (then
    :func:`_valid_rows` and :func:`_fold` decide).

    Clearly valid as :func:`_plainly_valid` says, for a float64 ``(3, n_agents + 1)``
    array: each row's sum within half the tolerance of 1, and no sign bit set (read from
    the array's bytes, one per value: a negative value, ``-0.0`` or a negative NaN sends
    the forecast to the full check, which accepts ``-0.0`` as before). ``powers``: at
    least ``gamma**0..2``.
    """
    if type(forecast) is not np.ndarray or forecast.dtype is not _FLOAT64:
        return None
    if forecast.shape != (3, n_agents + 1) or not forecast.tobytes()[_SIGN_BYTES].isascii():
        return None
    rows: list[list[float]] = forecast.tolist()
    r1, r2, r3 = rows
    if (
        _SUM_LOW <= sum(r1) <= _SUM_HIGH
        and _SUM_LOW <= sum(r2) <= _SUM_HIGH
        and _SUM_LOW <= sum(r3) <= _SUM_HIGH
    ):
        return rows, _fold_default_rows(rows, n_agents, powers)
    return None


def _fold_default_rows(
    rows: list[list[float]], n_agents: int, powers: Sequence[float]
) -> list[float]:
    """Fold three validated rows in one comprehension: the step weights are ``1.0``,
    ``gamma (1 - e1)`` and ``gamma^2 ((1 - e1)(1 - e2))``, the products
    :func:`_fold_rows` takes, and ``1.0 * p == p``; the END column's slot is then set
    to 0 (see :func:`_fold`)."""
    r1, r2, r3 = rows
    alive = 1.0 - r1[-1]
    w2 = powers[1] * alive
    w3 = powers[2] * (alive * (1.0 - r2[-1]))
    weights = [p1 + w2 * p2 + w3 * p3 for p1, p2, p3 in zip(r1, r2, r3)]  # noqa: B905
    weights[n_agents] = 0.0
    return weights


def _extend(
    weights: list[float],
    rows: list[list[float]],
    agents: tuple[str, ...],
    position: Mapping[str, int],
    gamma: float,
    powers: Sequence[float],
    call_shares: Mapping[str, float],
    tail_weight: float,
    history_weight: float,
) -> None:
    """Add the history blend and the tail past the horizon to Eq. 2's ``weights``
    (:func:`agent_weights`), in place."""
    if history_weight > 0.0:
        _blend_history(weights, rows, agents, gamma, call_shares, history_weight)
    mass = tail_weight * _tail_mass(rows, gamma, powers)
    for agent, share in call_shares.items():
        i = position.get(agent)
        if i is not None:
            weights[i] += mass * share


def history_sharpened(
    row: Sequence[float], agents: Sequence[str], call_shares: Mapping[str, float]
) -> list[float]:
    """Return a forecast row's agent probabilities reweighted by the workflow's history.

    ``Q[a] = (1 - e) P[a] (h[a] + epsilon) / sum_b P[b] (h[b] + epsilon)``, ``h`` the
    call shares, ``epsilon`` :data:`HISTORY_SMOOTHING`, ``1 - e = sum_b P[b]``: the
    forecast decides *whether* a kind of agent runs and how likely the workflow is to
    end, its own history *which* of the agents the forecast cannot tell apart. A row
    that names one agent is unchanged; a row with no agent mass is returned as is.

    Args:
        row: ``P[a]`` for ``agents`` (an END column past them is ignored).
        agents: the column names.
        call_shares: per agent, its share of the workflow's recent calls.
    """
    row = row[: len(agents)]
    scaled = [
        p * (call_shares.get(a, 0.0) + HISTORY_SMOOTHING) for a, p in zip(agents, row, strict=True)
    ]
    total = sum(scaled)
    if total <= 0.0:
        return list(row)
    factor = sum(row) / total
    return [x * factor for x in scaled]


def _blend_history(
    weights: list[float],
    rows: list[list[float]],
    agents: Sequence[str],
    gamma: float,
    call_shares: Mapping[str, float],
    history_weight: float,
) -> None:
    """Mix ``u`` (``weights``, in ``agents``' order) with the same fold over
    history-sharpened rows (:func:`agent_weights`).

    The survival weights ``gamma^(k-1) s^(k)`` read only the END column, which
    sharpening keeps, so the mixed weights are the fold of the mixed rows. ``rows``: the
    validated forecast's rows (END last)."""
    sharp = [0.0] * len(agents)
    step_weight = 1.0
    for row in rows:
        for i, q in enumerate(history_sharpened(row, agents, call_shares)):
            sharp[i] += step_weight * q
        step_weight *= gamma * (1.0 - row[-1])
    for i, value in enumerate(sharp):
        weights[i] += history_weight * (value - weights[i])


def beyond_horizon_mass(forecast: np.ndarray, gamma: float) -> float:
    """Return ``gamma^K s^(K+1) / (1 - gamma (1 - e))`` of a validated ``(K, |V|+1)``
    forecast: the discounted steps past the horizon, each ending with the last row's END
    probability ``e`` (see :func:`agent_weights`). The geometric series counts at most
    :data:`TAIL_MAX_STEPS` steps: with ``gamma = 1`` and ``e = 0`` it would not converge."""
    return _tail_mass(np.asarray(forecast, dtype=np.float64).tolist(), gamma, ())


def _tail_mass(rows: list[list[float]], gamma: float, powers: Sequence[float]) -> float:
    """:func:`beyond_horizon_mass` of a forecast's rows (``powers`` as in :func:`_fold_rows`)."""
    alive = 1.0
    for row in rows:
        alive *= 1.0 - row[-1]
    horizon = len(rows)
    decay = powers[horizon] if horizon < len(powers) else gamma**horizon
    ratio = 1.0 - gamma * (1.0 - rows[-1][-1])
    if ratio * TAIL_MAX_STEPS <= 1.0:
        return decay * alive * TAIL_MAX_STEPS
    return decay * alive / ratio


def _fold_rows(
    rows: list[list[float]], array: np.ndarray, gamma: float, powers: Sequence[float]
) -> list[float]:
    """Return ``u`` over a validated forecast's columns (END last) from its ``rows``
    (``array`` holds them). ``powers[k]``, where given, is ``gamma**k`` (taken once by
    the caller; the same float)."""
    weights = []  # gamma^(k-1) s^(k), s^(k) the probability the workflow still runs at k
    alive = 1.0
    for k, row in enumerate(rows):
        weights.append((powers[k] if k < len(powers) else gamma**k) * alive)
        alive *= 1.0 - row[-1]
    return _weighted_columns(weights, rows, array)


def _plainly_valid(forecast: np.ndarray, n_agents: int) -> list[list[float]] | None:
    """Return the forecast's rows if it is clearly valid, else ``None``.

    Clearly valid: shape ``(K >= 1, n_agents + 1)``, each row's sum within half of
    :data:`ROW_SUM_TOLERANCE` of 1 (so in any summation order within the full one; NaN
    and infinities fail it) and no negative value. Whatever fails goes to
    :func:`validate_forecast`, which decides. A float64 array is read as it is (the
    common case: ``np.asarray`` with a ``dtype`` costs as much as the row sums).
    """
    if type(forecast) is np.ndarray and forecast.dtype is _FLOAT64:
        array = forecast
    else:
        array = np.asarray(forecast, dtype=np.float64)
    if array.ndim != 2:
        return None
    rows: list[list[float]] = array.tolist()
    if not rows or len(rows[0]) != n_agents + 1:
        return None
    if len(rows) == 3:  # the default horizon, unrolled
        r1, r2, r3 = rows
        if (
            _SUM_LOW <= sum(r1) <= _SUM_HIGH
            and _SUM_LOW <= sum(r2) <= _SUM_HIGH
            and _SUM_LOW <= sum(r3) <= _SUM_HIGH
            and min(r1 + r2 + r3) >= 0.0
        ):
            return rows
        return None
    for row in rows:
        if not _SUM_LOW <= sum(row) <= _SUM_HIGH:
            return None
    return rows if min(sum(rows, [])) >= 0.0 else None


def _weighted_columns(
    weights: list[float], rows: list[list[float]], array: np.ndarray
) -> list[float]:
    """Return ``sum_k weights[k] * rows[k][j]`` for the agent columns ``j`` (``array``
    holds ``rows``; the END column may follow), bit-identical to ``weights @ array[:, :-1]``:
    numpy's matmul adds the ``k`` terms in order for ``K <= 3``, which plain Python does
    faster; longer horizons use it."""
    if len(weights) == 3:  # the default horizon, in one pass
        w1, w2, w3 = weights
        return [w1 * p1 + w2 * p2 + w3 * p3 for p1, p2, p3 in zip(*rows, strict=True)]
    if len(weights) < 3:
        return [sum(map(mul, weights, column)) for column in zip(*rows, strict=True)]
    columns: list[float] = (np.array(weights) @ array[:, :-1]).tolist()  # END left out
    return columns


class _ZeroIfMissing(dict[str, float]):
    """Per-agent weight changes; an agent the forecast does not name changes by 0."""

    def __missing__(self, agent: str) -> float:
        return 0.0


class _Flow:
    """One active workflow's forecast state (:class:`ScoreBoard`).

    Attributes:
        agents: the columns of its last forecast (``()`` before the first).
        position: each of ``agents``' column.
        weights: ``u[a]`` in ``agents``' order, then ``0.0``: an agent the forecast does
            not name weighs ``weights[position.get(a, -1)]``, 0.
        first: the last forecast's step-1 row ``P^(1)`` (END last); ``None`` before one.
        plan: per agent-set group, the ``weights`` slots of its agents (then the 0 slot)
            and its nodes: a forecast under the same ``agents`` sums each group's change
            from them; ``None`` when a group came or went or ``agents`` changed.
        scale: the time factor ``f_w`` (:meth:`ScoreBoard.set_time_weight`): ``weights``
            are ``raw`` times it.
        raw: ``u[a]`` as the forecast gives them (``weights`` before the time factor).
    """

    __slots__ = ("agents", "position", "weights", "first", "plan", "scale", "raw")

    def __init__(self) -> None:
        self.agents: tuple[str, ...] = ()
        self.position: dict[str, int] = {}
        self.weights: list[float] = [0.0]
        self.first: list[float] | None = None
        self.plan: list[tuple[Callable[[list[float]], tuple[float, ...]], set[Node]]] | None = None
        self.scale = 1.0
        self.raw: list[float] = self.weights

    def weight(self, agent: str) -> float:
        """Return ``u[agent]`` (0 for an agent the last forecast does not name)."""
        return self.weights[self.position.get(agent, -1)]

    def next_step(self, agent: str) -> float:
        """Return ``P^(1)[agent]`` of the last forecast times the time factor (0 before
        one, or if unnamed)."""
        i = self.position.get(agent)
        return 0.0 if i is None or self.first is None else self.first[i] * self.scale

    def predicted(self) -> dict[str, float]:
        """Return the last forecast's ``P^(1)`` per agent (empty before one)."""
        return {} if self.first is None else dict(zip(self.agents, self.first))  # noqa: B905


Move = tuple[float, set[Node]]
"""A forecast's score change for one agent-set group, and the group."""

_NO_FLOW = _Flow()
"""The state of a workflow the board does not hold (read only)."""


class ScoreBoard:
    """Per-workflow weights and per-node scores.

    Memory is bounded by the active workflows plus the ids of the last ``ended_memory``
    terminated ones (kept so that a late touch retires instead of reviving); a long-running
    server does not grow with the workflows it has served.

    A workflow's nodes are kept grouped by the agents of that workflow that touched them
    (``A_w(c)``), so a forecast computes each group's change once and then only adds it
    to the group's scores: most of a workflow's nodes share one agent set. While a
    workflow's forecasts name the same agents, each group's slots in the weight list
    are looked up once (:class:`_Flow`'s plan), not once per forecast.

    Args:
        reprioritize: called with each node whose score or retired flag changed.
        gamma: confidence decay ``gamma``.
        ended_memory: terminated workflow ids remembered, >= 1.
        shift_groups: called once per forecast with its ``(delta, group)`` moves: add
            ``delta`` to the score of each node of ``group`` and re-key it, in one pass
            (:meth:`RadixTree.shift_scores`); default: the addition here, then
            ``reprioritize`` on each node.
        beyond_horizon: read each workflow's recent call shares: the score's tail past
            the horizon, weighted by :attr:`miss_rate`, and the history-sharpened rows
            within it, weighted by :meth:`history_weight` (see :func:`agent_weights`);
            ``False``: Eq. 2 as the paper writes it.
    """

    def __init__(
        self,
        reprioritize: Callable[[Node], None],
        gamma: float,
        *,
        ended_memory: int = ENDED_MEMORY,
        shift_groups: Callable[[list[Move]], None] | None = None,
        beyond_horizon: bool = True,
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self._powers = tuple(gamma**k for k in range(_POWERS))  # gamma**k, taken once
        if ended_memory < 1:
            raise ValueError(f"ended_memory must be >= 1, got {ended_memory}")
        self.ended_memory = ended_memory
        self._gamma = gamma
        self.beyond_horizon = beyond_horizon
        self.miss_rate = 1.0
        """Moving average of ``1 - P^(1)[agent]`` over the calls a step-1 forecast named
        beforehand: how much the forecasts miss (1 until checked)."""
        self.history_evidence = PRIOR_EVIDENCE
        """Log-odds that the history-sharpened rows predict calls better than the
        forecast, over every checked call (forgotten at :data:`MISS_RATE_DECAY`); a new
        workflow starts from it (:meth:`note_invocation`)."""
        self._history_evidence: dict[str, float] = {}  # active workflows only
        self._call_shares: dict[str, dict[str, float]] = {}  # active workflows only
        self._reprioritize = reprioritize
        self._shift_groups = shift_groups or self._shift_each
        self._flows: dict[str, _Flow] = {}  # active workflows only
        self._nodes: dict[str, set[Node]] = {}
        # workflow -> its agents that touched a node -> those nodes (partitions _nodes)
        self._groups: dict[str, dict[frozenset[str], set[Node]]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ordinal: dict[str, int] = {}  # active workflows only: bounded like _nodes
        # active workflow -> agent -> the deepest node its latest request touched
        self._leaves: dict[str, dict[str, Node]] = {}
        self._ordinals = itertools.count()
        self.ordinals_version = 0
        """Bumped whenever an ordinal is given or forgotten: while it stays put,
        :meth:`ordinal` returns what it returned before and changes nothing."""
        self.workflows_version = 0
        """Bumped whenever a workflow joins or leaves :attr:`active_workflows`: while it
        stays put, that list is what it was."""
        self.refreshed_nodes = 0

    @property
    def gamma(self) -> float:
        """The confidence decay ``gamma``, fixed at construction (its powers are taken
        once)."""
        return self._gamma

    def _shift_each(self, moves: list[Move]) -> None:
        for delta, group in moves:
            for node in group:
                node.score += delta
                self._reprioritize(node)

    def ordinal(self, workflow_id: str) -> int:
        """Return ``workflow_id``'s start ordinal (0 for the first workflow seen): its age.

        Ordinals only grow; a terminated workflow's is forgotten (a late caller gets a
        new, younger one)."""
        ordinal = self._ordinal.get(workflow_id)
        if ordinal is None:
            ordinal = self._ordinal[workflow_id] = next(self._ordinals)
            self.ordinals_version += 1
        return ordinal

    @property
    def active_workflows(self) -> list[str]:
        return list(self._nodes)

    @property
    def ended_workflows(self) -> int:
        """Terminated workflow ids remembered (at most ``ended_memory``)."""
        return len(self._ended)

    def nodes_of(self, workflow_id: str) -> set[Node]:
        return self._nodes.get(workflow_id, set())

    def start(self, workflow_id: str) -> None:
        """Register an active workflow (no forecast yet: its weights are zero)."""
        self._ended.pop(workflow_id, None)
        self.ordinal(workflow_id)
        if workflow_id not in self._nodes:
            self._nodes[workflow_id] = set()
            self.workflows_version += 1
        self._groups.setdefault(workflow_id, {})
        if workflow_id not in self._flows:
            self._flows[workflow_id] = _Flow()

    def note_invocation(self, workflow_id: str, agent: str) -> None:
        """Note that ``workflow_id`` calls ``agent``: check the step-1 forecast made before
        the call (:attr:`miss_rate`) and count the call in the workflow's recent call
        shares, a moving average of one-hot calls (the latest weighs
        :data:`CALL_SHARE_DECAY`, the first 1), which the next forecast's tail reads.
        """
        if workflow_id in self._ended:
            return
        flow = self._flows.get(workflow_id)
        predicted = flow.predicted() if flow is not None else None
        shares = self._call_shares.get(workflow_id)
        if predicted:
            miss = 1.0 - min(1.0, max(0.0, predicted.get(agent, 0.0)))
            self.miss_rate += MISS_RATE_DECAY * (miss - self.miss_rate)
            if shares and self.beyond_horizon:
                self._weigh_history(workflow_id, agent, predicted, shares)
        if shares is None:
            self._call_shares[workflow_id] = {agent: 1.0}
            return
        for name in shares:
            shares[name] *= 1.0 - CALL_SHARE_DECAY
        shares[agent] = shares.get(agent, 0.0) + CALL_SHARE_DECAY

    def _weigh_history(
        self,
        workflow_id: str,
        agent: str,
        predicted: Mapping[str, float],
        shares: Mapping[str, float],
    ) -> None:
        """Add the call's ``log(Q[agent] / P[agent])`` to the history's evidence.

        ``P`` is the step-1 forecast made before the call, ``Q`` its history-sharpened
        row (:func:`history_sharpened`, from the call shares that forecast read). Both
        the workflow's evidence (starting from the board's) and the board's are
        forgotten toward the prior at :data:`MISS_RATE_DECAY` per call.
        """
        if agent not in predicted:
            return
        names = list(predicted)
        q = history_sharpened([predicted[a] for a in names], names, shares)[names.index(agent)]
        p = predicted[agent]
        ratio = _log_ratio(q, p)
        own = self._history_evidence.get(workflow_id, self.history_evidence)
        self._history_evidence[workflow_id] = _add_evidence(own, ratio)
        self.history_evidence = _add_evidence(self.history_evidence, ratio)

    def history_weight(self, workflow_id: str) -> float:
        """Return the mixture weight ``m`` of the history-sharpened rows for a workflow:
        the posterior probability ``1 / (1 + exp(-L))`` of its log-odds ``L``; 0 while
        ``L`` is below the prior's (:data:`HISTORY_WEIGHT_PRIOR`)."""
        evidence = self._history_evidence.get(workflow_id, self.history_evidence)
        if evidence < PRIOR_EVIDENCE:
            return 0.0
        return 1.0 / (1.0 + math.exp(-evidence))

    def touch(self, nodes: Iterable[Node], workflow_id: str, agent: str) -> None:
        """Record that ``agent`` of ``workflow_id`` used ``nodes`` (sets ``A_w(c)``).

        A workflow that has terminated is not brought back by a late request: what the
        late request used and no active workflow touched is retired, as it would have
        been had the request finished before the workflow did.

        Mutates: node accessors, scores, retired flags.
        """
        if workflow_id in self._ended:
            self._retire_unowned(nodes)
            return
        self.start(workflow_id)
        flow = self._flows[workflow_id]
        weight = flow.weight(agent)
        mine = self._nodes[workflow_id]
        groups = self._groups[workflow_id]
        age = self._ordinal[workflow_id]
        last = None
        for node in nodes:
            last = node
            agents = node.accessors.get(workflow_id)
            if agents is None:
                agents = node.accessors[workflow_id] = set()
            elif agent in agents:
                continue
            elif _leave(groups, frozenset(agents), node):
                flow.plan = None
            agents.add(agent)
            if _join(groups, frozenset(agents), node):
                flow.plan = None
            node.score += weight
            node.oldest = min(node.oldest, age)
            node.retired = False
            mine.add(node)
            self._reprioritize(node)
        if last is not None:
            self._leaves.setdefault(workflow_id, {})[agent] = last

    def leave_branch(self, workflow_id: str, agent: str, path: Sequence[Node]) -> int:
        """Note that ``agent`` of ``workflow_id`` starts a request whose cached prefix is
        ``path`` (root side first): the nodes of its previous request's branch that
        ``path`` does not hold are no longer its context, so ``agent`` leaves their
        ``A_w(c)``; a node no active workflow holds then is retired.

        A prompt that extends the previous one (an append-only conversation) holds its
        whole branch and changes nothing; a prompt rewritten above its tail (a re-planner
        rewriting its plan at the top) leaves the old tail dead, and without this the
        score would keep protecting it as long as the agent keeps running (issue 28).

        Returns:
            Nodes ``agent`` left.

        Mutates: accessors, scores, groups, retired flags of the left nodes.
        """
        leaf = self._leaves.get(workflow_id, {}).get(agent)
        if leaf is None or workflow_id in self._ended:
            return 0
        held = set(path)
        if leaf in held:
            return 0
        left = 0
        node: Node | None = leaf
        while node is not None and node.parent is not None and node not in held:
            left += self._leave_node(node, workflow_id, agent)
            node = node.parent
        return left

    def _leave_node(self, node: Node, workflow_id: str, agent: str) -> int:
        agents = node.accessors.get(workflow_id)
        if not agents or agent not in agents or node not in self._nodes[workflow_id]:
            return 0  # not its context, or the node left the tree (on_remove)
        flow = self._flows[workflow_id]
        groups = self._groups[workflow_id]
        if _leave(groups, frozenset(agents), node):
            flow.plan = None
        agents.discard(agent)
        node.score -= flow.weight(agent)
        if agents:
            if _join(groups, frozenset(agents), node):
                flow.plan = None
        else:
            del node.accessors[workflow_id]
            self._nodes[workflow_id].discard(node)
            node.oldest = min((self._ordinal[w] for w in node.accessors), default=NO_WORKFLOW)
            if not node.accessors:
                node.retired = True
                node.score = 0.0
        self._reprioritize(node)
        return 1

    def _retire_unowned(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if not node.accessors and not node.retired:
                node.retired = True
                node.score = 0.0
                self._reprioritize(node)

    def set_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Apply a new K-step forecast for ``workflow_id`` to the nodes it touched.

        Returns:
            The number of nodes refreshed (0 for a terminated workflow).

        Raises:
            ValueError: the forecast is malformed (:func:`validate_forecast`) or
                ``agents`` names an agent twice; nothing changes.

        Mutates: scores of the workflow's nodes only.
        """
        if type(agents) is not tuple:
            agents = tuple(agents)
        flow = self._flows.get(workflow_id)
        same = flow is not None and agents == flow.agents
        position = flow.position if same else _positions(agents)  # type: ignore[union-attr]
        shares = self._call_shares.get(workflow_id) if self.beyond_horizon else None
        mix = self.history_weight(workflow_id) if shares else 0.0
        folded = _fold_default(forecast, len(agents), self._powers)
        if folded is None:
            rows = _valid_rows(forecast, len(agents))
            new = _fold(
                rows, forecast, agents, position, self._gamma, self._powers, shares,
                self.miss_rate, mix,
            )  # fmt: skip
        else:
            rows, new = folded
            if shares:
                _extend(
                    new, rows, agents, position, self._gamma, self._powers, shares,
                    self.miss_rate, mix,
                )  # fmt: skip
        if flow is None:  # a workflow with a flow is active: terminate() drops it
            if workflow_id in self._ended:
                return 0  # a late forecast does not revive a terminated workflow
            self.start(workflow_id)
            flow = self._flows[workflow_id]
        flow.raw = new
        if flow.scale != 1.0:
            new = [u * flow.scale for u in new]
        if same:
            moves = self._moves(flow, new, self._groups[workflow_id])
        else:
            moves = self._moves_renamed(flow, agents, new, self._groups[workflow_id])
            flow.agents, flow.position, flow.plan = agents, position, None
        flow.weights = new
        flow.first = rows[0]
        if moves:
            self._shift_groups(moves)
        refreshed = len(self._nodes[workflow_id])
        self.refreshed_nodes += refreshed
        return refreshed

    def set_time_weight(self, workflow_id: str, weight: float) -> int:
        """Scale ``workflow_id``'s share of its nodes' scores by ``weight`` (its time
        factor ``f_w``, :mod:`pbkv.kvmanager.timing`): ``u[a]`` becomes ``weight`` times
        the forecast's, now and for its later forecasts, until set again.

        Returns:
            Nodes refreshed (0 for a workflow the board does not hold).

        Raises:
            ValueError: ``weight`` is not in (0, 1].

        Mutates: scores of the workflow's nodes only.
        """
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"time weight must be in (0, 1], got {weight}")
        flow = self._flows.get(workflow_id)
        if flow is None or weight == flow.scale:
            return 0
        new = [u * weight for u in flow.raw] if weight != 1.0 else list(flow.raw)
        moves = self._moves(flow, new, self._groups[workflow_id])
        flow.weights, flow.scale = new, weight
        if moves:
            self._shift_groups(moves)
        refreshed = len(self._nodes[workflow_id])
        self.refreshed_nodes += refreshed
        return refreshed

    @staticmethod
    def _moves(
        flow: _Flow, new: list[float], groups: dict[frozenset[str], set[Node]]
    ) -> list[Move]:
        """Return each group's change ``sum_{a in A_w(c)} (u_new[a] - u_old[a])`` with
        the group, where it is not 0; ``new`` and ``flow.weights`` in the same
        ``agents``' order.

        ``u_new[a] - u_old[a]`` is taken once per agent, not once per node and agent; a
        group's change sums them in its set's order (then the 0 slot's ``0.0 - 0.0``:
        ``x + 0.0 == x`` but for the sign of a zero, and a zero change moves nothing), as
        the per-node sum always did.
        """
        change = list(map(sub, new, flow.weights))  # after - before, per slot
        plan = flow.plan
        if plan is None:
            plan = flow.plan = _plan(flow, groups)
        moves = []
        for slots, group in plan:
            delta = sum(slots(change))
            if delta:
                moves.append((delta, group))
        return moves

    @staticmethod
    def _moves_renamed(
        flow: _Flow,
        agents: tuple[str, ...],
        new: list[float],
        groups: dict[frozenset[str], set[Node]],
    ) -> list[Move]:
        """:meth:`_moves` for a forecast whose ``agents`` differ from the last one's (or
        the first), by agent name: an agent only the new forecast names changes by
        ``u_new``, one only the old names by ``0 - u_old``, one neither names by 0."""
        after = dict(zip(agents, new))  # noqa: B905 (the 0 slot left out)
        change = _ZeroIfMissing(after)
        for agent, before in zip(flow.agents, flow.weights):  # noqa: B905
            change[agent] = after.get(agent, 0.0) - before
        changed = change.__getitem__
        moves = []
        for agents_used, group in groups.items():
            delta = sum(map(changed, agents_used))
            if delta:
                moves.append((delta, group))
        return moves

    def terminate(self, workflow_id: str) -> None:
        """Drop a finished workflow; nodes no active workflow touched become retired.

        Mutates: accessors, scores, retired flags of the workflow's nodes.
        """
        self._ended[workflow_id] = None
        self._ended.move_to_end(workflow_id)
        while len(self._ended) > self.ended_memory:
            self._ended.popitem(last=False)
        flow = self._flows.pop(workflow_id, None) or _Flow()
        self._call_shares.pop(workflow_id, None)
        self._history_evidence.pop(workflow_id, None)
        self._groups.pop(workflow_id, None)
        self._leaves.pop(workflow_id, None)
        if self._ordinal.pop(workflow_id, None) is not None:
            self.ordinals_version += 1
        if workflow_id in self._nodes:
            self.workflows_version += 1
        for node in self._nodes.pop(workflow_id, set()):
            agents = node.accessors.pop(workflow_id, set())
            node.score -= sum(flow.weight(a) for a in agents)
            node.oldest = min((self._ordinal[w] for w in node.accessors), default=NO_WORKFLOW)
            if not node.accessors:
                node.retired = True
                node.score = 0.0
            self._reprioritize(node)

    def check_integrity(self) -> None:
        """Assert that each workflow's groups partition its nodes by ``A_w(c)``, and that
        a workflow's plan (:class:`_Flow`), where it has one, is that of its groups.

        Raises:
            AssertionError: a node is missing from its group, sits in another group, or
                a group is empty, or the plan holds other groups or slots; the message
                names the workflow and the counts.
        """
        for workflow_id, nodes in self._nodes.items():
            groups = self._groups.get(workflow_id, {})
            grouped = sum(len(g) for g in groups.values())
            members = set().union(*groups.values())
            if grouped != len(nodes) or members != nodes:
                raise AssertionError(
                    f"workflow {workflow_id}: {len(nodes)} nodes but {grouped} in groups "
                    f"({len(members ^ nodes)} differ)"
                )
            for agents, group in groups.items():
                wrong = [n for n in group if frozenset(n.accessors.get(workflow_id, ())) != agents]
                if wrong or not group:
                    raise AssertionError(
                        f"workflow {workflow_id}: group {sorted(agents)} holds "
                        f"{len(wrong)} of {len(group)} nodes with other agents"
                    )
            self._check_plan(workflow_id, groups)

    def _check_plan(self, workflow_id: str, groups: dict[frozenset[str], set[Node]]) -> None:
        flow = self._flows.get(workflow_id)
        if flow is None or flow.plan is None:
            return
        slots = [float(i) for i in range(len(flow.agents) + 1)]  # each slot reads its index
        planned = [(getter(slots), id(group)) for getter, group in flow.plan]
        expected = [(getter(slots), id(group)) for getter, group in _plan(flow, groups)]
        if planned != expected:
            raise AssertionError(
                f"workflow {workflow_id}: a plan of {len(planned)} groups where "
                f"{len(expected)} are due ({len(set(planned) ^ set(expected))} differ)"
            )

    def next_step_value(self, node: Node) -> float:
        """Return ``sum_w A_w(c) . P_w^(1)``: the k=1 term of the score, for prefetch."""
        flows = self._flows
        return sum(
            sum((flows.get(w) or _NO_FLOW).next_step(a) for a in agents)
            for w, agents in node.accessors.items()
        )

    def on_split(self, node: Node, top: Node) -> None:
        """Tree hook: ``top`` was split off above ``node`` and inherits its accessors."""
        for w, agents in top.accessors.items():
            if w not in self._nodes:
                self.workflows_version += 1
            self._nodes.setdefault(w, set()).add(top)
            if _join(self._groups.setdefault(w, {}), frozenset(agents), top):
                self._forget_plan(w)

    def on_remove(self, node: Node) -> None:
        """Tree hook: ``node`` left the tree."""
        for w, agents in node.accessors.items():
            self._nodes.get(w, set()).discard(node)
            groups = self._groups.get(w)
            if groups is not None and _leave(groups, frozenset(agents), node):
                self._forget_plan(w)

    def _forget_plan(self, workflow_id: str) -> None:
        flow = self._flows.get(workflow_id)
        if flow is not None:
            flow.plan = None


def _add_evidence(evidence: float, ratio: float) -> float:
    """Return log-odds ``evidence`` after one call's ``ratio``, the older evidence
    forgotten toward :data:`PRIOR_EVIDENCE` at :data:`MISS_RATE_DECAY`."""
    return PRIOR_EVIDENCE + (1.0 - MISS_RATE_DECAY) * (evidence - PRIOR_EVIDENCE) + ratio


def _log_ratio(q: float, p: float) -> float:
    """Return ``log(q / p)`` clipped to ``[-EVIDENCE_CAP, EVIDENCE_CAP]`` (0 if both are 0)."""
    if q <= 0.0 and p <= 0.0:
        return 0.0
    if q <= 0.0 or p <= 0.0:
        return EVIDENCE_CAP if p <= 0.0 else -EVIDENCE_CAP
    return min(EVIDENCE_CAP, max(-EVIDENCE_CAP, math.log(q / p)))


def _leave(groups: dict[frozenset[str], set[Node]], agents: frozenset[str], node: Node) -> bool:
    """Take ``node`` out of its agent-set group; return whether that dropped the group
    (it was left empty)."""
    group = groups.get(agents)
    if group is not None:
        group.discard(node)
        if not group:
            del groups[agents]
            return True
    return False


def _join(groups: dict[frozenset[str], set[Node]], agents: frozenset[str], node: Node) -> bool:
    """Put ``node`` in its agent-set group; return whether that made the group."""
    group = groups.get(agents)
    if group is None:
        groups[agents] = {node}
        return True
    group.add(node)
    return False


def _plan(
    flow: _Flow, groups: dict[frozenset[str], set[Node]]
) -> list[tuple[Callable[[list[float]], tuple[float, ...]], set[Node]]]:
    """Return :class:`_Flow`'s plan for ``groups``: per group, a getter of its agents'
    slots of a list in ``flow.agents``' order (in the group's set order; an agent
    ``flow.agents`` does not name reads the 0 slot), then the 0 slot, and the group."""
    zero = len(flow.agents)
    position = flow.position
    return [
        (itemgetter(*[position.get(a, zero) for a in agents], zero), group)
        for agents, group in groups.items()
    ]
