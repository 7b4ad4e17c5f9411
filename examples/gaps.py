"""Tool latencies and user think times of the bundled apps: ``bundled`` and ``cited`` gaps.

A *gap* is the time between one call of a workflow and the next that no LLM spends: the
tool the previous agent ran, or the human reading and typing. Each app draws its own gaps
(its ``GAP_BEFORE_S`` / ``TOOL_GAP_S`` ranges, uniform); that is the ``bundled`` model,
the default, under which every published figure was made. Under ``cited``, the gaps that
a source documents are drawn from that source's distribution instead, from the workflow's
:data:`GAP_STREAM`; the others keep the app's own draw and are *uncited*. Either way the
app draws its bundled gap first, from its own stream, so a workflow's prompts and outputs
are the same under both models and only the gaps differ. ``--gap-scale`` (the bench's
``scale_gaps``, the runtime's ``gap_scale``) multiplies every gap of either model.

The distributions (sources, the numbers taken and how they were fitted: ``docs/gaps.md``):

- :data:`SWE_TEST_RUN_S`, :data:`SWE_SEARCH_S`, :data:`SWE_EDIT_S`, :data:`PYTHON_RUN_S`:
  empirical quantiles of the tool calls of Claude Code (Haiku 4.5) on 45 SWE-rebench
  tasks, AgentCgroup (Zheng et al., arXiv 2602.09345), raw traces
  ``experiments/all_images_haiku/*/attempt_1/tool_calls.json`` of
  ``github.com/yunwei37/agentcgroup`` at 5af9e7b, Bash commands classified by the
  repository's own ``categorize_bash_command``.
- :data:`WEB_SEARCH_S`, :data:`PAGE_FETCH_S`: lognormals through a vendor's reported
  ranges (TinyFish, "The hidden latency tax of AI agents": a search call 200–1,000 ms, a
  page fetch 2–6 s), each range taken as the 5th–95th percentiles.
- :data:`READING_WPM`, :data:`TYPING_WPM`: a human's silent reading rate (Brysbaert 2019,
  J. Memory and Language 109:104047: mean 238 wpm, most adults 175–300) and typing rate
  (Dhakal et al., CHI 2018: mean 51.56 wpm, SD 20.2), each a lognormal; a τ-bench
  user's think time is the agent's message read plus the reply typed
  (:meth:`Typist.turn_s`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pbkv.live.graph import State

GAP_MODELS = ("bundled", "cited")
"""The gap models, by name; ``bundled`` is the default."""

GAP_STREAM = "gap"
"""The workflow's generator (:meth:`pbkv.live.State.rng`) that cited gaps are drawn from."""

_Z_95 = NormalDist().inv_cdf(0.95)
_U_MIN = 1e-12  # a uniform draw of exactly 0 would map to a lognormal's 0


@dataclass(frozen=True, slots=True)
class Lognormal:
    """A lognormal of median ``median`` and log-sd ``sigma`` (units of ``median``).

    Raises:
        ValueError: ``median`` is not > 0 or ``sigma`` is negative.
    """

    median: float
    sigma: float

    def __post_init__(self) -> None:
        if not (self.median > 0 and self.sigma >= 0):
            raise ValueError(f"need median > 0 and sigma >= 0, got {self.median}, {self.sigma}")

    @classmethod
    def through(cls, p5: float, p95: float) -> Lognormal:
        """Return the lognormal whose 5th and 95th percentiles are ``p5`` and ``p95``."""
        return cls(math.sqrt(p5 * p95), math.log(p95 / p5) / (2 * _Z_95))

    @classmethod
    def of_moments(cls, mean: float, sd: float) -> Lognormal:
        """Return the lognormal of mean ``mean`` and standard deviation ``sd``."""
        sigma = math.sqrt(math.log1p((sd / mean) ** 2))
        return cls(mean / math.exp(sigma**2 / 2), sigma)

    def quantile(self, u: float) -> float:
        """Return the value below which a fraction ``u`` in [0, 1) of draws fall."""
        return self.median * math.exp(self.sigma * NormalDist().inv_cdf(max(u, _U_MIN)))


@dataclass(frozen=True, slots=True)
class EmpiricalQuantiles:
    """A distribution through measured quantiles, log-linear between them.

    Args:
        probabilities: increasing, from 0 (the minimum measured) to 1 (the maximum).
        values: the measured quantiles at ``probabilities``, increasing and > 0.

    Raises:
        ValueError: the knots are not as above (the message says which).
    """

    probabilities: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        p, v = self.probabilities, self.values
        if len(p) != len(v) or len(p) < 2 or p[0] != 0.0 or p[-1] != 1.0:
            raise ValueError(f"need matching knots from p=0 to p=1, got {p} and {v}")
        if any(b <= a for a, b in itertools.pairwise(p)) or any(
            b < a for a, b in itertools.pairwise(v)
        ):
            raise ValueError(f"knots must increase, got {p} and {v}")
        if v[0] <= 0:
            raise ValueError(f"values must be > 0, got {v}")

    def quantile(self, u: float) -> float:
        """Return the value below which a fraction ``u`` in [0, 1) of draws fall."""
        p, v = self.probabilities, self.values
        i = min(bisect.bisect_right(p, u), len(p) - 1)
        frac = (u - p[i - 1]) / (p[i] - p[i - 1])
        return math.exp(math.log(v[i - 1]) + frac * (math.log(v[i]) - math.log(v[i - 1])))


Distribution = Lognormal | EmpiricalQuantiles


@dataclass(frozen=True, slots=True)
class CitedGap:
    """One documented gap distribution, in seconds.

    Args:
        name: what it is (``"swe_test_run"``).
        distribution: its quantile function, seconds.
        source: the short citation (``docs/gaps.md`` has the numbers and the fit).
    """

    name: str
    distribution: Distribution
    source: str

    def draw_s(self, rng: np.random.Generator) -> float:
        """Return one gap, rounded to milliseconds; consumes one uniform of ``rng``."""
        return round(self.distribution.quantile(float(rng.random())), 3)


_AGENTCGROUP = "AgentCgroup (arXiv 2602.09345), Claude Code + Haiku 4.5 on SWE-rebench"
_TINYFISH = "TinyFish, 'The hidden latency tax of AI agents' (vendor-reported range)"
_QUANTILE_PROBABILITIES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)

SWE_TEST_RUN_S = CitedGap(
    "swe_test_run",
    EmpiricalQuantiles(
        _QUANTILE_PROBABILITIES,
        (0.055, 0.432, 0.927, 1.227, 2.086, 6.377, 29.467, 120.417, 120.862),
    ),
    f"{_AGENTCGROUP}: Bash 'Test Execution' calls (n=164)",
)
"""A test run (pytest, tox, unittest); the top 4% is Claude Code's 120 s Bash timeout."""

SWE_SEARCH_S = CitedGap(
    "swe_search",
    EmpiricalQuantiles(
        _QUANTILE_PROBABILITIES,
        (0.015, 0.023, 0.031, 0.046, 0.437, 1.198, 1.542, 2.239, 3.196),
    ),
    f"{_AGENTCGROUP}: Grep, Glob, Read and Bash file-exploration/text calls (n=551)",
)
"""A repository search or file read."""

SWE_EDIT_S = CitedGap(
    "swe_edit",
    EmpiricalQuantiles(
        _QUANTILE_PROBABILITIES,
        (0.014, 0.030, 0.035, 0.044, 0.065, 0.078, 0.085, 0.124, 0.138),
    ),
    f"{_AGENTCGROUP}: Edit and Write calls (n=139)",
)
"""Applying a patch (a file edit or write)."""

PYTHON_RUN_S = CitedGap(
    "python_run",
    EmpiricalQuantiles(
        _QUANTILE_PROBABILITIES,
        (0.046, 0.087, 0.331, 0.940, 1.189, 1.522, 1.814, 5.332, 6.720),
    ),
    f"{_AGENTCGROUP}: Bash 'Python Run' and 'Python Snippet' calls (n=30)",
)
"""Running a program or a computation in Python."""

WEB_SEARCH_S = CitedGap(
    "web_search", Lognormal.through(0.2, 1.0), f"{_TINYFISH}: a search call 200-1,000 ms"
)
"""A search-API call (5th-95th percentiles 0.2-1.0 s; median 0.447 s, sigma 0.489)."""

PAGE_FETCH_S = CitedGap(
    "page_fetch", Lognormal.through(2.0, 6.0), f"{_TINYFISH}: a page fetch 2-6 s"
)
"""Fetching and rendering one page (5th-95th percentiles 2-6 s; median 3.46 s)."""

READING_WPM = Lognormal(238.0, math.log(300 / 175) / (2 * _Z_95))
"""Silent reading rate, words per minute: median 238, and the 95th percentile 300/175
times the 5th (Brysbaert 2019: mean 238 wpm for non-fiction; most adults 175-300)."""

TYPING_WPM = Lognormal.of_moments(51.56, 20.2)
"""Typing rate, words per minute: mean 51.56, SD 20.2 (Dhakal et al., CHI 2018);
median 48.0, sigma 0.378."""


@dataclass(frozen=True, slots=True)
class Typist:
    """One human user's reading and typing rates, words per minute."""

    reading_wpm: float
    typing_wpm: float

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Typist:
        """Draw a user's rates (:data:`READING_WPM`, :data:`TYPING_WPM`); two uniforms."""
        reading_u, typing_u = float(rng.random()), float(rng.random())
        return cls(READING_WPM.quantile(reading_u), TYPING_WPM.quantile(typing_u))

    def turn_s(self, read_words: int, typed_words: int) -> float:
        """Return the seconds to read ``read_words`` and type ``typed_words``, to ms."""
        return round(60.0 * (read_words / self.reading_wpm + typed_words / self.typing_wpm), 3)


CITED_GAPS: Mapping[str, Mapping[str, CitedGap]] = {
    "codegen": {"analyzer": SWE_TEST_RUN_S},
    "financebench": {"analyst": WEB_SEARCH_S, "writer": PYTHON_RUN_S},
    "groupchat": {"researcher": WEB_SEARCH_S, "engineer": PYTHON_RUN_S},
    "hover": {"reader": WEB_SEARCH_S},
    "swebench": {"localizer": SWE_SEARCH_S, "coder": SWE_EDIT_S, "tester": SWE_TEST_RUN_S},
    "toolloop": {"search": WEB_SEARCH_S, "read": PAGE_FETCH_S},
}
"""Per app, the gap key (what the app's gap waits on: the agent about to be called, or
the worker or tool that ran before it, as the app's docstring says) → its cited
distribution. A key that is not here keeps the app's own draw under ``cited`` (uncited).
``taubench``'s user turns are :class:`Typist` think times, not a table entry."""


def check_gap_model(gap_model: str) -> str:
    """Return ``gap_model`` if it names a gap model.

    Raises:
        ValueError: it is not one of :data:`GAP_MODELS` (the message lists them).
    """
    if gap_model not in GAP_MODELS:
        raise ValueError(f"unknown gap model {gap_model!r}; known: {', '.join(GAP_MODELS)}")
    return gap_model


@dataclass(frozen=True, slots=True)
class AppGaps:
    """One app's gaps under one gap model.

    Args:
        app: the app's name (a key of :data:`CITED_GAPS`, or any name: no cited gaps).
        gap_model: ``bundled`` or ``cited``.

    Raises:
        ValueError: ``gap_model`` is unknown (the message lists the known ones).
    """

    app: str
    gap_model: str = "bundled"
    cited: Mapping[str, CitedGap] = field(init=False)

    def __post_init__(self) -> None:
        check_gap_model(self.gap_model)
        table = CITED_GAPS.get(self.app, {}) if self.gap_model == "cited" else {}
        object.__setattr__(self, "cited", table)

    def gap_s(self, key: str | None, bundled_s: float, state: State) -> float:
        """Return the gap before a call whose gap waits on ``key``.

        ``bundled_s`` is the app's own draw (already made, so its stream advances the
        same under every model). It is returned unless the model is ``cited`` and
        ``key`` has a cited distribution; that is then drawn from ``state``'s
        :data:`GAP_STREAM`. ``key=None`` (nothing ran before the call) keeps
        ``bundled_s``.
        """
        cited = self.cited.get(key) if key is not None else None
        return bundled_s if cited is None else cited.draw_s(state.rng(GAP_STREAM))
