"""What the torch engine's steps cost, measured as they run: the base of its balanced
batches and of the costs it reports to the scheduler (§7.0; the sim's
:class:`~pbkv.engines.sim.costmodel.CostModel`, measured instead of modelled).

Plain synchronous code; the engine feeds it each step's forward time.
"""

from __future__ import annotations

DEFAULT_SMOOTHING = 0.2
"""Weight of the newest decode forward in its moving average, and of the newest mixed
step in the free-token estimate (the engine's decode-step estimate for prefetch uses
the same)."""

DEFAULT_PREFILL_SMOOTHING = 0.05
"""Weight of the newest step in the fits of prefill time on chunk tokens and of decode
time on decoding rows: a fit needs steps of several sizes, so it remembers more of them
(about 20)."""

MIN_RELATIVE_SPREAD = 0.25
"""Least standard deviation of the fitted sizes, over their mean, for a fit's slope to
be trusted; below it the mean stands in (all of it per token for prefill, all of it per
forward for decode)."""


class _Fit:
    """Least squares of seconds on a size, ``seconds = intercept + size x slope``, over
    recent observations (weights decaying by ``1 - smoothing`` an observation)."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        # decayed sums: weight, sizes, seconds, sizes², sizes x seconds
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def add(self, size: float, seconds: float) -> None:
        keep = 1.0 - self.smoothing
        self._w = keep * self._w + 1.0
        self._n = keep * self._n + size
        self._t = keep * self._t + seconds
        self._nn = keep * self._nn + size * size
        self._nt = keep * self._nt + size * seconds

    @property
    def empty(self) -> bool:
        return self._w == 0.0

    def line(self) -> tuple[float, float] | None:
        """Return ``(intercept, slope)``; ``None`` while empty or while the sizes vary
        too little (or the slope is not positive) to fit a slope."""
        if self._w == 0.0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        variance = self._nn / self._w - mean_n * mean_n
        if variance >= (MIN_RELATIVE_SPREAD * mean_n) ** 2:
            slope = (self._nt / self._w - mean_n * mean_t) / variance
            if slope > 0:
                return mean_t - slope * mean_n, slope
        return None

    def means(self) -> tuple[float, float]:
        """Return the mean size and the mean seconds (the fit must not be empty)."""
        return self._n / self._w, self._t / self._w


class StepCosts:
    """Moving estimates of what a forward costs: per decoding row and per forward, per
    prefill token, and how many prefill tokens ride in a decode forward for free.

    Prefill time is fitted as ``overhead + tokens x per-token`` over the steps that only
    prefill, and decode time as ``per-forward + rows x per-row`` over those that only
    decode, by least squares over recent steps: each forward reads the weights and runs
    its layers whatever its size, and that part is not what a token or a row costs. A
    step that carries prefill tokens beside decodes tells how many of its tokens the
    decode forward hid (it took no longer for them): on a GPU, whose decode leaves
    compute idle, up to the idle compute's worth; on a CPU, which runs a token's compute
    whatever runs beside it, none.

    Args:
        smoothing: weight of the newest decode forward and mixed step, in ``(0, 1]``.
        prefill_smoothing: weight of the newest step in the fits, in ``(0, 1]``.

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
        """Seconds of one batched decode forward (a moving average over the pure decode
        forwards, whatever their batch); ``None`` until measured."""
        self._prefill = _Fit(prefill_smoothing)
        self._decode = _Fit(prefill_smoothing)
        self._free_tokens: float | None = None

    def observe(self, prefill_tokens: int, decode_rows: int, forward_s: float) -> float:
        """Fold one forward in: ``prefill_tokens`` prefilled beside ``decode_rows``
        decoding requests in ``forward_s`` seconds; return the seconds billed to its
        decodes (the rest is prefill's).

        A pure decode forward is billed whole to decode; a mixed one bills its decodes
        what a pure decode forward costs now (:attr:`decode_step_s`, at most the
        forward; nothing until one is measured) and its prefill the rest, and tells how
        many of its tokens the decode forward hid (:meth:`prefill_slack_tokens`). The
        moving average, not the fit of :meth:`decode_s`, bills: a fit's slope over a
        few batch sizes swings with every slow step on a loaded machine.

        Raises:
            ValueError: a negative count or time.

        Mutates: the estimates of the parts the step ran.
        """
        if prefill_tokens < 0 or decode_rows < 0 or forward_s < 0:
            raise ValueError(
                f"need non-negative figures, got {prefill_tokens} tokens, {decode_rows} rows, "
                f"{forward_s} s"
            )
        if not prefill_tokens:
            if decode_rows and forward_s > 0:
                self._observe_decode(decode_rows, forward_s)
            return forward_s if decode_rows else 0.0
        if not decode_rows:
            self._prefill.add(float(prefill_tokens), forward_s)
            return 0.0
        alone_s = self.decode_step_s
        if alone_s is None:
            return 0.0
        self._observe_mixed(prefill_tokens, forward_s - alone_s)
        return min(forward_s, alone_s)

    def _observe_decode(self, rows: int, seconds: float) -> None:
        self._decode.add(float(rows), seconds)
        if self.decode_step_s is None:
            self.decode_step_s = seconds
        else:
            self.decode_step_s += self.smoothing * (seconds - self.decode_step_s)

    def _observe_mixed(self, tokens: int, extra_s: float) -> None:
        """Fold in how many of ``tokens`` prefill tokens rode free in a decode forward
        that took ``extra_s`` seconds more than it alone would have.

        Only a chunk of at least the current estimate tests it (the engine probes one
        block above it): a smaller chunk (a prompt's tail) that hid all its tokens says
        nothing new, and one that took a little longer is more likely a slow step than a
        smaller slack; counted, such chunks would only pull the estimate down, and
        chunks capped at the estimate could never pull it back up. A slack that shrinks
        shows on the probes.
        """
        per_token_s = self.prefill_s_per_token
        if per_token_s is None or per_token_s <= 0:
            return
        if self._free_tokens is not None and tokens < self._free_tokens:
            return
        free = min(float(tokens), max(0.0, tokens - extra_s / per_token_s))
        if self._free_tokens is None:
            self._free_tokens = free
        else:
            self._free_tokens += self.smoothing * (free - self._free_tokens)

    @property
    def prefill_s_per_token(self) -> float | None:
        """Marginal seconds per prefill token: the fit's slope, or the mean seconds per
        token (overhead included) while the chunks' sizes vary too little to fit or the
        slope is not positive; ``None`` until a prefill is measured."""
        if self._prefill.empty:
            return None
        line = self._prefill.line()
        if line is not None:
            return line[1]
        mean_n, mean_t = self._prefill.means()
        return mean_t / mean_n

    def decode_s(self, rows: int) -> float | None:
        """Return the seconds of a pure decode forward of ``rows`` requests: the fit, or
        the mean pure decode forward while its batches vary too little to fit; ``None``
        until one is measured."""
        if self._decode.empty:
            return None
        line = self._decode.line()
        if line is None:
            return self._decode.means()[1]
        return max(0.0, line[0] + rows * line[1])

    @property
    def forward_s(self) -> float | None:
        """Seconds of a decode forward that do not grow with its rows (the weights'
        read, launches): the fit's intercept, or all of the mean decode forward while
        the batches vary too little to fit, at most :attr:`decode_step_s`; ``None``
        until a decode is measured."""
        if self._decode.empty or self.decode_step_s is None:
            return None
        line = self._decode.line()
        intercept = self._decode.means()[1] if line is None else max(0.0, line[0])
        return min(intercept, self.decode_step_s)

    def prefill_slack_tokens(self) -> int | None:
        """Return the prefill tokens a decode forward carries without taking longer.

        Measured on the steps that ran prefill beside decodes: a step of ``n`` tokens
        that took ``x`` seconds more than its decodes alone hid ``n - x / per-token`` of
        them (moving average over the chunks of at least the estimate). This is the
        sim's stall-free budget (:meth:`CostModel.prefill_slack_tokens`, Sarathi-Serve's
        token budget), measured: on a GPU the decode forward's idle compute, on a CPU
        about none.

        Returns:
            Tokens ``>= 0``, or ``None`` until a mixed step is measured with a prefill
            and a decode of its rows known.

        Does not modify the estimates.
        """
        return None if self._free_tokens is None else int(self._free_tokens)
