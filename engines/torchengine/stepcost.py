"""What the torch engine's steps cost, measured as they run: the base of its balanced
batches (§7.0; the sim's :meth:`CostModel.prefill_slack_tokens`, measured instead of
modelled).

Plain synchronous code; the engine feeds it each step's worker-thread timings.
"""

from __future__ import annotations

DEFAULT_SMOOTHING = 0.2
"""Weight of the newest decode forward in its moving average (the engine's decode-step
estimate for prefetch uses the same)."""

DEFAULT_PREFILL_SMOOTHING = 0.05
"""Weight of the newest prefill step in the fit of prefill time on chunk tokens: a fit
needs chunks of several sizes, so it remembers more steps (about 20)."""

MIN_RELATIVE_SPREAD = 0.25
"""Least standard deviation of the fitted chunks' sizes, over their mean, for the fit's
slope to be trusted; below it the mean seconds per token stands in."""


class StepCosts:
    """Moving estimates of a decode forward's seconds and a prefill token's marginal seconds.

    Prefill time is fitted as ``overhead + tokens x per-token`` by least squares over
    recent steps (weights decaying by ``1 - prefill_smoothing`` a step): each forward
    reads the weights and runs its layers whatever its size, and that overhead is not
    what a token costs.

    Args:
        smoothing: weight of the newest decode forward, in ``(0, 1]``.
        prefill_smoothing: weight of the newest prefill step in the fit, in ``(0, 1]``.

    Raises:
        ValueError: a smoothing outside ``(0, 1]``.
    """

    def __init__(
        self,
        smoothing: float = DEFAULT_SMOOTHING,
        prefill_smoothing: float = DEFAULT_PREFILL_SMOOTHING,
    ) -> None:
        for name, value in (("smoothing", smoothing), ("prefill_smoothing", prefill_smoothing)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        self.smoothing = smoothing
        self.prefill_smoothing = prefill_smoothing
        self.decode_step_s: float | None = None
        """Seconds of one batched decode forward; ``None`` until measured."""
        # decayed sums of the fit: weight, tokens, seconds, tokens², tokens x seconds
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def observe(self, prefill_tokens: int, prefill_s: float, decode_s: float) -> None:
        """Fold one step in: ``prefill_tokens`` prefilled in ``prefill_s`` seconds (none:
        ``0``) and a decode forward of ``decode_s`` seconds (none: ``0.0``).

        Raises:
            ValueError: a negative count or time.

        Mutates: the estimates of the parts the step ran.
        """
        if prefill_tokens < 0 or prefill_s < 0 or decode_s < 0:
            raise ValueError(
                f"need non-negative figures, got {prefill_tokens} tokens, "
                f"{prefill_s} s prefill, {decode_s} s decode"
            )
        if prefill_tokens:
            keep, n = 1.0 - self.prefill_smoothing, float(prefill_tokens)
            self._w = keep * self._w + 1.0
            self._n = keep * self._n + n
            self._t = keep * self._t + prefill_s
            self._nn = keep * self._nn + n * n
            self._nt = keep * self._nt + n * prefill_s
        if decode_s > 0:
            if self.decode_step_s is None:
                self.decode_step_s = decode_s
            else:
                self.decode_step_s += self.smoothing * (decode_s - self.decode_step_s)

    @property
    def prefill_s_per_token(self) -> float | None:
        """Marginal seconds per prefill token: the fit's slope, or the mean seconds per
        token (overhead included) while the chunks' sizes vary too little to fit or the
        slope is not positive; ``None`` until a prefill is measured."""
        if self._w == 0.0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance >= (MIN_RELATIVE_SPREAD * mean_n) ** 2:
            slope = (self._nt / self._w - mean_n * mean_t) / variance
            if slope > 0:
                return slope
        return mean_t / mean_n

    def prefill_slack_tokens(self) -> int | None:
        """Return the prefill tokens whose marginal time fills one decode forward's.

        The sim's stall-free budget is the decode step's idle compute over a token's
        compute (Sarathi-Serve's token budget on a roofline); on a bandwidth-bound
        decode that is the decode step's time over a prefill token's marginal time,
        which is what this measures. The torch engine runs such a chunk in the decode
        forward itself, so it adds only its marginal time: on a GPU, whose decode idles
        compute, the step stays about as long; on a CPU, where a prefill token costs its
        time whatever runs beside it, the step lasts about two decode forwards, never a
        full chunk.

        Returns:
            Tokens ``>= 0``, or ``None`` until both a prefill and a decode are measured.

        Does not modify the estimates.
        """
        per_token_s = self.prefill_s_per_token
        if per_token_s is None or self.decode_step_s is None or per_token_s <= 0:
            return None
        return int(self.decode_step_s / per_token_s)
