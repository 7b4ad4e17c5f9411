"""What the torch engine's steps cost, measured as they run: the base of its balanced
batches (§7.0, the sim's :meth:`CostModel.prefill_slack_tokens` measured instead of
modelled).

Plain synchronous code; the engine feeds it each step's worker-thread timings.
"""

from __future__ import annotations

DEFAULT_SMOOTHING = 0.2
"""Weight of the newest step in each moving average (the engine's decode-step estimate
for prefetch uses the same)."""


class StepCosts:
    """Moving averages of the prefill seconds per token and the decode forward seconds.

    Args:
        smoothing: weight of the newest observation, in ``(0, 1]``.

    Raises:
        ValueError: ``smoothing`` outside ``(0, 1]``.
    """

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.prefill_s_per_token: float | None = None
        """Seconds per prefill token, forward overhead included; ``None`` until measured."""
        self.decode_step_s: float | None = None
        """Seconds of one batched decode forward; ``None`` until measured."""

    def observe(self, prefill_tokens: int, prefill_s: float, decode_s: float) -> None:
        """Fold one step in: ``prefill_tokens`` prefilled in ``prefill_s`` seconds (none:
        ``0``) and a decode forward of ``decode_s`` seconds (none: ``0.0``).

        Raises:
            ValueError: a negative count or time.

        Mutates: the averages of the parts the step ran.
        """
        if prefill_tokens < 0 or prefill_s < 0 or decode_s < 0:
            raise ValueError(
                f"need non-negative figures, got {prefill_tokens} tokens, "
                f"{prefill_s} s prefill, {decode_s} s decode"
            )
        if prefill_tokens:
            self.prefill_s_per_token = self._fold(
                self.prefill_s_per_token, prefill_s / prefill_tokens
            )
        if decode_s > 0:
            self.decode_step_s = self._fold(self.decode_step_s, decode_s)

    def prefill_slack_tokens(self) -> int | None:
        """Return the prefill tokens this engine computes in one decode forward's time.

        The sim's stall-free budget is the decode step's idle compute times the prefill
        rate (Sarathi-Serve's token budget on a roofline); on a bandwidth-bound decode
        that is the decode step's time times the prefill rate, which is what this
        measures. A step carrying it runs its prefill and decode forwards one after
        the other, so it lasts about two decode forwards: a decode never waits behind a
        full chunk. The per-token time includes each forward's fixed overhead, so where
        a decode forward is little more than that overhead the budget shrinks towards
        nothing (the engine keeps at least one block).

        Returns:
            Tokens ``>= 0``, or ``None`` until both averages are measured.

        Does not modify the averages.
        """
        if self.prefill_s_per_token is None or self.decode_step_s is None:
            return None
        if self.prefill_s_per_token <= 0:
            return None
        return int(self.decode_step_s / self.prefill_s_per_token)

    def _fold(self, current: float | None, sample: float) -> float:
        if current is None:
            return sample
        return current + self.smoothing * (sample - current)
