"""Per-agent weights that a forecast lends the KV manager's Score (paper Eq. 2-4, §5.3).

With forecast rows ``P^(k)`` conditional on being alive before step ``t+k`` (see
:mod:`pbkv.predictor.base`), the survival ``s^(k) = prod_{j<k} (1 - P^(j)[END])`` (Eq. 3)
is the probability that step ``t+k`` happens, and the Score of node ``c`` (Eq. 2/4)

    Score(c) = sum_k gamma^(k-1) sum_w s_w^(k) (A_w(c) . P_w^(k))
             = sum_w A_w(c) . u_w,   u_w[a] = sum_k gamma^(k-1) s_w^(k) P_w^(k)[a]

is a dot product with the per-workflow agent weights ``u_w`` computed here.
"""

from __future__ import annotations

import numpy as np


def survival(forecast: np.ndarray) -> np.ndarray:
    """Return ``s^(k) = prod_{j<k} (1 - P^(j)[END])`` (paper Eq. 3); ``s^(1) = 1``.

    Args:
        forecast: forecast rows with ``END`` in the last column.

    Returns:
        float64 array of the survival of each step.

    Raises:
        ValueError: ``forecast`` has fewer than 2 dimensions.

    Shapes:
        forecast ``(B, K, |V|+1)`` (or ``(K, |V|+1)``) -> ``(B, K)`` (or ``(K,)``).
    """
    p = _check(forecast)
    alive_after = np.cumprod(1.0 - p[..., -1], axis=-1)
    s = np.ones(p.shape[:-1])
    s[..., 1:] = alive_after[..., :-1]
    return s


def agent_weights(forecast: np.ndarray, gamma: float) -> np.ndarray:
    """Return ``u[a] = sum_k gamma^(k-1) s^(k) P^(k)[a]`` per agent (paper Eq. 2-4).

    ``Score(c)`` of a node is ``sum_w A_w(c) . u_w`` over the active workflows that
    touched it. ``END`` gets no weight.

    Args:
        forecast: forecast rows with ``END`` in the last column.
        gamma: the confidence decay, in ``(0, 1]``.

    Returns:
        float64 array of agent weights.

    Raises:
        ValueError: ``gamma`` outside ``(0, 1]`` or ``forecast`` under 2 dimensions.

    Shapes:
        forecast ``(B, K, |V|+1)`` (or ``(K, |V|+1)``) -> ``(B, |V|)`` (or ``(|V|,)``).
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    p = _check(forecast)
    decay = gamma ** np.arange(p.shape[-2])
    step_weight = decay * survival(p)
    return np.einsum("...k,...ka->...a", step_weight, p[..., :-1])


def _check(forecast: np.ndarray) -> np.ndarray:
    p = np.asarray(forecast, dtype=np.float64)
    if p.ndim < 2:
        raise ValueError(f"forecast must be (..., K, |V|+1), got shape {p.shape}")
    return p
