"""The noise wrapper ``P~ = (1 - lambda) P + lambda U`` for the prediction-noise study (§6)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from pbkv.predictor.base import Forecast, Forecaster, WorkflowState
from pbkv.predictor.online import OnlineAccuracy, OnlineMarkovForecaster


class NoiseForecaster:
    """Mix another forecaster's rows with noise.

    With ``seed=None``, ``U`` is the uniform distribution over agents and ``END``, so the
    mix is deterministic. With an integer seed, ``U`` is drawn afresh for every row,
    uniformly over the probability simplex (a flat Dirichlet), from a generator seeded
    once; the same seed and call sequence give the same forecasts.

    Args:
        inner: the forecaster whose rows are mixed; its ``agents`` and ``horizon`` are
            kept.
        lam: ``lambda``, the noise weight, in ``[0, 1]``.
        seed: ``None`` for the uniform ``U``; an int for random ``U``.

    Raises:
        ValueError: ``lam`` outside ``[0, 1]``.
    """

    def __init__(self, inner: Forecaster, lam: float, *, seed: int | None = None) -> None:
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        self.inner = inner
        self.lam = lam
        self.name = f"{inner.name}+noise{lam:g}"
        self.agents: tuple[str, ...] = tuple(inner.agents)
        self.horizon = inner.horizon
        self._rng = None if seed is None else np.random.default_rng(seed)

    def forecast(self, states: Sequence[WorkflowState]) -> np.ndarray:
        """Return ``(1 - lam) * inner.forecast(states) + lam * U``.

        Args:
            states: passed to the inner forecaster.

        Returns:
            float64 array, shape ``(len(states), K, |V|+1)``; each row sums to 1.

        Raises:
            ValueError: as the inner forecaster.
        """
        p = np.asarray(self.inner.forecast(states), dtype=np.float64)
        if self._rng is None:
            u = np.full_like(p, 1.0 / p.shape[-1])
        else:
            u = self._rng.dirichlet(np.ones(p.shape[-1]), size=p.shape[:-1])
        return (1.0 - self.lam) * p + self.lam * u


class OnlineNoiseForecaster(NoiseForecaster):
    """The noise wrapper around an online forecaster (per-app columns, learning as it
    serves): each :class:`~pbkv.predictor.base.Forecast` is mixed as
    :class:`NoiseForecaster` mixes rows; learning and accuracy pass through to ``inner``.

    Args:
        inner: an :class:`~pbkv.predictor.online.OnlineMarkovForecaster`.
        lam / seed: as :class:`NoiseForecaster`.
    """

    def __init__(self, inner: OnlineMarkovForecaster, lam: float, *, seed: int | None = None):
        super().__init__(inner, lam, seed=seed)  # type: ignore[arg-type]
        self.online = inner

    def forecast_each(self, states: Sequence[WorkflowState]) -> list[Forecast | None]:
        """Return the inner forecasts, each mixed with noise (``None`` stays ``None``)."""
        out: list[Forecast | None] = []
        for forecast in self.online.forecast_each(states):
            if forecast is None:
                out.append(None)
                continue
            p = forecast.probabilities
            if self._rng is None:
                u = np.full_like(p, 1.0 / p.shape[-1])
            else:
                u = self._rng.dirichlet(np.ones(p.shape[-1]), size=p.shape[:-1])
            out.append(Forecast((1.0 - self.lam) * p + self.lam * u, forecast.agents))
        return out

    def observe(
        self, app: str, path: Sequence[str], *, tenant: str = "", workflow_id: str = ""
    ) -> None:
        """Learn from one ended workflow (the inner model's counts; noise is not learned)."""
        self.online.observe(app, path, tenant=tenant, workflow_id=workflow_id)

    def observe_step(
        self, workflow_id: str, app: str, path: Sequence[str], *, tenant: str = ""
    ) -> None:
        """Learn from a running workflow's grown path (the inner model's counts)."""
        self.online.observe_step(workflow_id, app, path, tenant=tenant)

    def warm_start(self, app: str, agents: Sequence[str], edges: Iterable[tuple[str, str]]) -> None:
        """As :meth:`~pbkv.predictor.online.OnlineMarkovForecaster.warm_start`."""
        self.online.warm_start(app, agents, edges)

    def accuracy(self) -> OnlineAccuracy:
        """The inner model's accuracy (of its own forecasts, before noise)."""
        return self.online.accuracy()
