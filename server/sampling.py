"""A request's sampling parameters as the engine takes them, made safe as vLLM makes them.

Plain code, no trio. OpenAI's ``temperature`` and ``top_p`` pass the schema's ranges
(``[0, 2]``, ``(0, 1]``) at any magnitude, but an engine that samples in float32 divides
by a temperature of 1e-46 as by zero (NaN probabilities) and reads a top_p of 1e-46 as 0
(no token kept). As vLLM (``vllm/sampling_params.py``: ``_MAX_TEMP``), a temperature in
``(0, 0.01)`` is raised to 0.01 and 0 is greedy; a top_p below float32's smallest normal
number is raised to it, where it still keeps the most likely token alone, as any top_p at
most that token's probability does (vLLM's top-p always keeps one token).
"""

from __future__ import annotations

from typing import Any

MIN_TEMPERATURE = 1e-2
"""The least non-zero temperature sampled with (vLLM's ``_MAX_TEMP``); below it, this."""

MIN_TOP_P = 2.0**-126
"""The least top_p sampled with: float32's smallest normal number."""


def request_sampling(temperature: float | None, top_p: float | None, seed: int | None) -> Any:
    """Return the engine's :class:`pbkv.engines.base.Sampling` for a request's fields.

    Args:
        temperature: the request's ``temperature`` (``None``: OpenAI's default, 1).
        top_p: the request's ``top_p`` (``None``: 1).
        seed: the request's ``seed``.

    Returns:
        The sampling, ``temperature`` raised to :data:`MIN_TEMPERATURE` when below it and
        not 0, ``top_p`` raised to :data:`MIN_TOP_P` when below it.
    """
    from pbkv.engines.base import Sampling

    temperature = 1.0 if temperature is None else temperature
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    top_p = 1.0 if top_p is None else max(top_p, MIN_TOP_P)
    return Sampling(temperature=temperature, top_p=top_p, seed=seed)
