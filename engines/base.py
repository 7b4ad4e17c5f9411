"""The engine protocol: generate a request, report cache hits and timings (§7).

Two control styles share it: *owned cache* engines (``sim``, ``torch``) use the KV
manager's radix tree as their allocator; *engine-owned cache* engines (``trtllm``)
decide themselves and are steered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a real engine picks each output token (OpenAI's sampling parameters).

    Args:
        temperature: ``0`` = greedy (argmax); otherwise logits are divided by it.
        top_p: nucleus sampling: keep the smallest set of tokens whose probability
            reaches ``top_p`` (``1`` keeps all).
        seed: seeds the request's own generator, so a sampled reply is reproducible;
            ``None`` draws one from the request id. In ``[-2**63, 2**64)``, the range
            ``torch.Generator.manual_seed`` takes.

    Raises:
        ValueError: ``temperature < 0``, ``top_p`` outside ``(0, 1]``, or ``seed``
            outside ``[-2**63, 2**64)``.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must be in [-2**63, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation request.

    Args:
        request_id: unique per engine.
        workflow_id / agent: who asks (for the KV manager's access indicators).
        prompt_token_ids: the prompt, shape ``(prompt_tokens,)``.
        segment_lengths: token counts of the prompt's segments (preamble, role,
            context), summing to the prompt length.
        max_new_tokens: decode budget.
        scripted_output_token_ids: for replaying engines (``sim``), the tokens to emit;
            real engines ignore it and sample.
        namespace: tenant / cache salt.
        fixed_prefix_tokens: leading tokens that are the agent's fixed prefix (shared
            preamble + role prompt; KVFlow protects these).
        sampling: how real engines pick tokens (greedy by default).
        on_token: called in the event loop with each output token id as it is
            produced (streaming); must not block. Returning ``True`` ends the request
            after that token (a stop sequence completed): owned-cache engines finish it
            at the end of the step like a normal finish, and its result holds the tokens
            up to and including that one. Engines that cannot end early (``trtllm``)
            ignore the return value. One that raises ends its request there too, which
            then fails with :class:`CallbackFailed` (owned-cache engines).
    """

    request_id: str
    workflow_id: str | None
    agent: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    segment_lengths: tuple[int, ...] = ()
    scripted_output_token_ids: tuple[int, ...] = ()
    namespace: str = ""
    fixed_prefix_tokens: int = 0
    sampling: Sampling = GREEDY
    on_token: Callable[[int], bool | None] | None = None


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """What one request produced and what it cost.

    Attributes:
        output_token_ids: generated tokens.
        prompt_tokens: prompt length.
        cached_gpu_tokens / cached_host_tokens: prompt tokens served from each tier.
        computed_tokens: prompt tokens prefilled.
        queue_s: submit to admission; ttft_s: submit to first token; e2e_s: submit to
            last token (engine clock seconds).
        hidden: post-norm hidden state of the last prefill token, shape ``(d_model,)``,
            or ``None``.
    """

    request_id: str
    output_token_ids: tuple[int, ...]
    prompt_tokens: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    computed_tokens: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    hidden: np.ndarray | None = None


@runtime_checkable
class Engine(Protocol):
    """An inference engine pbkv can drive.

    Attributes:
        owns_cache: the KV manager's radix tree is the engine's allocator.
        has_host_tier: evicted KV can be kept in host memory and reloaded.
        has_hidden_state: results carry the last-prefill hidden state.
    """

    owns_cache: bool
    has_host_tier: bool
    has_hidden_state: bool

    async def run(self, *, task_status: Any = ...) -> None:
        """Run the engine's scheduler until cancelled; report ready via ``task_status``."""
        ...

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Serve one request; raises ``EngineError`` if it fails."""
        ...

    def statistics(self) -> Any:
        """Return the engine's statistics record."""
        ...


class EngineError(RuntimeError):
    """A request failed inside the engine; its leases were released.

    Attributes:
        retryable: whether the same request may succeed later (an engine restart, a
            transient fault); ``False`` for :class:`RequestTooLarge`.
    """

    retryable = True


class CallbackFailed(EngineError):
    """A request's ``on_token`` callback raised; the request ended at that token and
    its cache was kept as at a normal end. ``__cause__`` is the callback's exception.

    Only that request fails: the engine's other requests run on. Retrying cannot help.
    """

    retryable = False


class RequestTooLarge(EngineError):
    """The request can never fit the GPU tier (prompt + decode budget > capacity).

    Raised by ``generate`` at once, before the request is queued; retrying cannot help.
    """

    retryable = False
