"""A K-step forecast folded into per-agent reuse weights ``u_w[a]`` (paper Eq. 2–4, §5.3).

``u_w[a] = sum_k gamma^(k-1) s_w^(k) P_w^(k)[a]``, with the tail past the horizon and the
history-sharpened rows of :func:`agent_weights`; :class:`~pbkv.kvmanager.scoring.ScoreBoard`
adds them to the nodes each workflow touched. Plain Python over the few rows of a forecast
(:func:`fold_default`), bit for bit the numpy form.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from operator import mul

import numpy as np

ROW_SUM_TOLERANCE = 1e-4
"""How far a forecast row's sum may be from 1 (float32 models round; more is a bug)."""
_SUM_LOW, _SUM_HIGH = 1.0 - ROW_SUM_TOLERANCE / 2, 1.0 + ROW_SUM_TOLERANCE / 2
"""Row sums in this range are accepted without numpy (see :func:`_plainly_valid`)."""
TAIL_MAX_STEPS = 64.0
"""Most discounted steps past the horizon the tail counts (:func:`beyond_horizon_mass`);
reached only as ``gamma (1 - e)`` nears 1 (at ``gamma = 0.8`` the series sums to <= 5)."""
HISTORY_SMOOTHING = 0.05
"""``epsilon`` of the history expert ``share[a] + epsilon`` (:func:`agent_weights`): an
agent the workflow has not called yet keeps part of its forecast."""
_FLOAT64 = np.dtype(np.float64)
_SIGN_BYTES = slice(7, None, 8) if sys.byteorder == "little" else slice(0, None, 8)
"""The byte of each float64 of an array's bytes that holds its sign bit."""


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
    (``gamma**k`` itself past them: the same float either way): :func:`fold` as dicts."""
    agents = tuple(agents)
    rows = valid_rows(forecast, len(agents))
    weights = fold(
        rows, forecast, agents, positions(agents), gamma, powers, call_shares, tail_weight,
        history_weight,
    )  # fmt: skip
    return dict(zip(agents, weights)), dict(zip(agents, rows[0]))  # noqa: B905 (END left out)


def positions(agents: tuple[str, ...]) -> dict[str, int]:
    """Return each agent's column.

    Raises:
        ValueError: ``agents`` names an agent twice (its columns would be one weight).
    """
    position = {agent: i for i, agent in enumerate(agents)}
    if len(position) != len(agents):
        raise ValueError(f"agents name an agent twice: {list(agents)}")
    return position


def valid_rows(forecast: np.ndarray, n_agents: int) -> list[list[float]]:
    """Return a forecast's rows (END last) if it is well formed (:func:`validate_forecast`)."""
    rows = _plainly_valid(forecast, n_agents)
    if rows is None:  # not clearly valid: accepted or refused exactly as before
        rows = validate_forecast(forecast, n_agents).tolist()
    return rows


def fold(
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
    ``powers``) folds as :func:`fold_default` does.
    """
    n = len(agents)
    if len(rows) == 3 and len(powers) >= 3:
        weights = _fold_default_rows(rows, n, powers)
    else:
        weights = _fold_rows(rows, np.asarray(forecast, dtype=np.float64), gamma, powers)
        del weights[n:]  # the END column, where the fold took it
        weights.append(0.0)
    if call_shares:
        extend(
            weights, rows, agents, position, gamma, powers, call_shares, tail_weight, history_weight
        )
    return weights


def fold_default(
    forecast: np.ndarray, n_agents: int, powers: Sequence[float]
) -> tuple[list[list[float]], list[float]] | None:
    """Return the rows and the Eq. 2 weights (as :func:`fold` without shares) of a
    default-horizon forecast that is clearly valid, else ``None`` (then
    :func:`_valid_rows` and :func:`fold` decide).

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
    to 0 (see :func:`fold`)."""
    r1, r2, r3 = rows
    alive = 1.0 - r1[-1]
    w2 = powers[1] * alive
    w3 = powers[2] * (alive * (1.0 - r2[-1]))
    weights = [p1 + w2 * p2 + w3 * p3 for p1, p2, p3 in zip(r1, r2, r3)]  # noqa: B905
    weights[n_agents] = 0.0
    return weights


def extend(
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
