"""The worker thread's half of a torch engine step: the step's records, its block
copies, and one packed forward with its sampling (§7.2).

The engine plans a step on the trio thread (:class:`StepPlan`) and hands it to
:meth:`StepWorker.execute` in a worker thread (``trio.to_thread``): the queued copies
run in order, then every row (prefill chunks and one decode token per decoding request)
in one forward, with one LM head over the rows that emit a token and one device-to-host
read of their greedy picks. The worker writes each request's ``pos``, ``output``,
``hidden`` and ``finished``; everything else is the engine's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pbkv.engines.constrained import request_constraint
from pbkv.engines.owned import Queued
from pbkv.engines.torchengine.forward import PagedForward, Segment
from pbkv.engines.torchengine.pool import BlockCopy, CopyDone, PagedKVPools

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Entry(Queued):
    """A request's state. The worker thread writes ``pos``..``finished`` during a step."""

    write_from: int = 0  # first position whose KV this request writes (the rest is shared)
    prompt_committed: bool = False
    pos: int = 0  # tokens whose KV is in the pool
    output: list[int] = field(default_factory=list)
    hidden: np.ndarray | None = None
    finished: bool = False
    generator: Any = None  # torch.Generator of a sampled (non-greedy) request

    @property
    def prefilled(self) -> bool:
        return self.pos >= self.prompt_tokens


@dataclass(frozen=True, slots=True)
class Chunk:
    """``tokens`` prompt tokens of ``entry`` to prefill."""

    entry: Entry
    tokens: int


@dataclass(frozen=True, slots=True)
class Row:
    """One request's work in a step's forward: its segment (a chunk or a decode token)."""

    entry: Entry
    segment: Segment

    @property
    def emits(self) -> bool:
        """Whether this row ends in a token to sample (a decode, or a prompt's end)."""
        return self.segment.end >= self.entry.prompt_tokens


@dataclass(frozen=True, slots=True)
class StepPlan:
    copies: list[BlockCopy]
    prefills: list[Chunk]
    decodes: list[Entry]
    rows: list[Row] = field(default_factory=list)  # the forward's work, in order

    @property
    def empty(self) -> bool:
        return not (self.copies or self.prefills or self.decodes)


@dataclass(frozen=True, slots=True)
class Executed:
    """What one step's worker run gave back: the copies' completion, the requests whose
    own work raised, and the worker's seconds in copies and in the forward."""

    done: CopyDone
    failed: dict[Entry, Exception]
    copy_s: float
    forward_s: float


class StepWorker:
    """Run a step's copies and its rows' forward; sample each emitting row's token.

    Args:
        model: the engine's model (see :class:`~pbkv.engines.torchengine.forward.PagedForward`).
        pools: the device and host pools the copies and the forward use.
        stop_tokens: generation ends at any of these.
    """

    def __init__(
        self, model: PreTrainedModel, pools: PagedKVPools, stop_tokens: frozenset[int]
    ) -> None:
        self.pools = pools
        self.device = next(model.parameters()).device
        self._paged = PagedForward(model, pools)
        self._head = model.get_output_embeddings()
        self._stop = stop_tokens
        self.forwards = 0
        """Model forwards run (one per step that computes; more only where a failed
        forward is run again row by row)."""

    def execute(self, plan: StepPlan) -> Executed:
        """Run one step's copies (in queue order), then its rows in one forward.

        Returns the copies' completion, the requests whose own work raised, with the
        error (their forward: a packed forward that raises is run again row by row to
        find them; or their sampling; these fail alone), and the seconds spent in
        copies and in the forward (sampling included).

        Raises:
            Exception: the copies failed, or every row's forward in the step did
                (nothing ran: the engine, not a request, is at fault), so the step fails
                as a whole.
        """
        failed: dict[Entry, Exception] = {}
        with torch.inference_mode():
            t0 = time.perf_counter()
            done = self.pools.copy(plan.copies) if plan.copies else CopyDone(None)
            t1 = time.perf_counter()
            ran = self._run_rows(plan.rows, failed) if plan.rows else 0
            self._wait_for_compute()  # so the forward's time is its own
            t2 = time.perf_counter()
        if failed and not ran:
            raise next(iter(failed.values()))
        return Executed(done, failed, t1 - t0, t2 - t1)

    def _wait_for_compute(self) -> None:
        """Wait for the kernels queued on the compute stream (not the copy stream's)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _run_rows(self, rows: list[Row], failed: dict[Entry, Exception]) -> int:
        """Run ``rows`` in one forward and take each one's token; return how many rows'
        forwards ran.

        A packed forward that raises left every request as it was (only slots it
        would write were touched); each row is then run alone, and those whose own
        forward raises join ``failed``.
        """
        try:
            hidden = self._forward(rows)
        except Exception as exc:
            if len(rows) == 1:
                failed[rows[0].entry] = exc
                return 0
            log.warning("a forward of %d rows failed (%r): running each alone", len(rows), exc)
        else:
            self._advance(rows, hidden, failed)
            return len(rows)
        ran = 0
        for row in rows:
            try:
                hidden = self._forward([row])
            except Exception as exc:
                failed[row.entry] = exc
                continue
            ran += 1
            self._advance([row], hidden, failed)
        return ran

    def _forward(self, rows: list[Row]) -> torch.Tensor:
        """Run ``rows``' segments in one packed forward (their KV lands in the pool).

        Shapes:
            return: the post-norm hidden state of each row's last token,
            ``(len(rows), d_model)``.
        """
        self.forwards += 1
        return self._paged([row.segment for row in rows])

    def _advance(
        self, rows: list[Row], hidden: torch.Tensor, failed: dict[Entry, Exception]
    ) -> None:
        """Move each row's request past its segment: count its prefilled tokens, keep a
        finished prompt's hidden state, and sample the token of every row that emits
        one (a request whose sampling raises joins ``failed``).

        One LM head runs over the emitting rows and one device read fetches their
        argmax (and the new prompt hidden states), whatever the batch.
        """
        for row in rows:
            if row.segment.cached_tokens < row.entry.prompt_tokens:
                row.entry.pos = row.segment.end
        emitting = [i for i, row in enumerate(rows) if row.emits]
        if not emitting:
            return
        index = torch.tensor(emitting, dtype=torch.long, device=hidden.device)
        last = hidden.index_select(0, index)
        logits = self._head(last)
        greedy = logits.argmax(-1).tolist()
        firsts = [j for j, i in enumerate(emitting) if rows[i].entry.hidden is None]
        if firsts:
            states = last[firsts].float().cpu().numpy()
            for state, j in zip(states, firsts, strict=True):
                rows[emitting[j]].entry.hidden = state
        for j, i in enumerate(emitting):
            entry = rows[i].entry
            try:
                token = self._sample(entry, logits[j], greedy[j])
            except Exception as exc:
                failed[entry] = exc
                continue
            entry.output.append(token)
            if len(entry.output) >= entry.request.max_new_tokens or token in self._stop:
                entry.finished = True

    def _sample(self, entry: Entry, logits: torch.Tensor, argmax: int) -> int:
        """Pick the next token from ``logits`` (shape ``(vocab,)``) by the request's sampling.

        Greedy is ``argmax`` (computed for the whole batch at once); otherwise
        temperature, then top-p (nucleus), drawn from the entry's own generator so a
        seeded request is reproducible. A constrained request's grammar first masks the
        tokens it does not allow.
        """
        constraint = request_constraint(entry.request)
        if constraint is not None:  # tool_choice required/named, response_format
            logits = constraint.mask_logits(entry.output, logits)
            argmax = int(logits.argmax())  # the batch's argmax ignored the mask
        sampling = entry.request.sampling
        if sampling.greedy:
            return argmax
        if entry.generator is None:
            seed = sampling.seed
            if seed is None:
                digest = hashlib.blake2b(entry.request.request_id.encode(), digest_size=8)
                seed = int.from_bytes(digest.digest())
            entry.generator = torch.Generator(device="cpu").manual_seed(seed)
        logits = logits.float().cpu()
        scaled = logits / sampling.temperature
        if not bool(torch.isfinite(scaled).all()):
            # a tiny temperature overflows to inf (softmax: nan); shifted so the largest
            # is 0, the rest go to -inf and the draw is the argmax
            scaled = (logits - logits.max()) / sampling.temperature
        probs = torch.softmax(scaled, dim=-1)
        if sampling.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < sampling.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=entry.generator))


def stop_tokens(configured: tuple[int, ...] | None, model: PreTrainedModel) -> frozenset[int]:
    """Return the tokens that end generation: ``configured``, or the model's
    ``eos_token_id`` (one or several) when ``configured`` is ``None``."""
    if configured is not None:
        return frozenset(configured)
    eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
