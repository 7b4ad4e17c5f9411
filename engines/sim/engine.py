"""The virtual-time engine: continuous batching over a roofline cost model (§7.1).

Runs inside trio; every step sleeps its modelled duration, so under
``trio.testing.MockClock(autojump_threshold=0)`` a run of hours takes seconds and the
same workload and seed give the same figures. The KV manager's radix tree is the
allocator (owned cache): admission matches, leases, evicts and reloads through it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import trio

from pbkv.engines.admission import ForwardCosts
from pbkv.engines.base import GenerateRequest
from pbkv.engines.owned import OwnedCacheEngine, Queued
from pbkv.engines.scheduler import Scheduler
from pbkv.engines.sim.costmodel import CostModel
from pbkv.kvmanager import Admission, KVManager, LoadTransfer, block_keys
from pbkv.runtime.clock import now_s

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Scheduler limits of the sim engine.

    Args:
        max_batch_size: most requests running at once (prefilling or decoding).
        max_prefill_tokens: prefill tokens per step, shared by the batch (chunked
            prefill).
        check_integrity: assert the KV manager's invariants after every step (tests).
    """

    max_batch_size: int = 64
    max_prefill_tokens: int = 8192
    check_integrity: bool = False


@dataclass(frozen=True, slots=True)
class SimStatistics:
    """Engine counters: steps, modelled busy time, tokens, host-link time, and running
    requests retracted to admit another (§7.0)."""

    steps: int
    busy_s: float
    prefill_tokens: int
    decode_tokens: int
    link_busy_s: float
    prefetch_steps: int
    retractions: int = 0


@dataclass(eq=False)
class _Entry(Queued):
    prefill_pos: int = 0
    generated: int = 0  # tokens of ``output`` produced in this run
    output: tuple[int, ...] = ()  # what this run emits: the scripted tokens, padded


class SimEngine(OwnedCacheEngine[_Entry]):
    """Virtual-time engine over a :class:`KVManager` and a :class:`CostModel`.

    Args:
        kv: the KV manager whose tree is the allocator.
        cost: hardware × model cost model.
        config: scheduler limits.
        scheduler: admission order (see :class:`~pbkv.engines.owned.OwnedCacheEngine`).
    """

    entry_type = _Entry
    has_hidden_state = False
    samples_tokens = False  # emits each request's scripted output (replies are simulated)

    def __init__(
        self,
        kv: KVManager,
        cost: CostModel,
        config: SimConfig | None = None,
        *,
        scheduler: str | Scheduler = "fcfs",
    ) -> None:
        self.config = config or SimConfig()
        super().__init__(kv, self.config.max_batch_size, scheduler)
        self.cost = cost
        self._costs = ForwardCosts(cost.forward_s(), cost.prefill_token_s())
        self._pending_loads: dict[LoadTransfer, float] = {}
        self._link_free_s = 0.0
        self._steps = 0
        self._busy_s = 0.0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._link_busy_s = 0.0
        self._prefetch_steps = 0

    # -- public ---------------------------------------------------------------------

    def statistics(self) -> SimStatistics:
        return SimStatistics(
            steps=self._steps,
            busy_s=self._busy_s,
            prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
            link_busy_s=self._link_busy_s,
            prefetch_steps=self._prefetch_steps,
            retractions=self._retractions,
        )

    # -- one scheduler step -----------------------------------------------------------

    async def _step(self) -> None:
        self._complete_loads(now_s())
        self._admit()
        decoding = [
            e for e in self._running if e.first_token_s and e.prefill_pos >= e.prompt_tokens
        ]
        kv_tokens = sum(e.prompt_tokens + e.generated for e in decoding)
        chunks = self._plan_prefill(self._prefill_budget(len(decoding), kv_tokens))
        if not chunks and not decoding:
            await self._idle()
            return
        work = [(n, e.prefill_pos) for e, n in chunks]
        step_s = self.cost.step_s(work, len(decoding), kv_tokens)
        prefill_s = self.cost.prefill_compute_s(work) if chunks else 0.0
        self._note_busy(step_s, min(step_s, prefill_s))  # prefill's share of the compute
        if not chunks and not self._waiting:
            self._prefetch(step_s)  # idle space and idle bandwidth only (§5.4)
        await trio.sleep(step_s)
        self._steps += 1
        self._busy_s += step_s
        self._advance(chunks, decoding)
        if self.config.check_integrity:
            self.kv.check_integrity()

    async def _idle(self) -> None:
        started_s = now_s()
        await self._wait_for_work(min(self._pending_loads.values(), default=math.inf))
        self._note_idle(now_s() - started_s)

    def _start(self, entry: _Entry, admission: Admission) -> None:
        entry.admission = admission
        entry.output = _output_tokens(entry.request)
        cached = admission.cached_gpu_tokens + admission.cached_host_tokens
        entry.prefill_pos = min(cached, entry.prompt_tokens - 1)  # recompute >= 1 for logits
        for load in admission.loads:
            if load not in self._pending_loads:
                self._enqueue_load(load)
        self._running.append(entry)

    def _forward_costs(self) -> ForwardCosts:
        """Return the cost model's forward and prefill-token seconds
        (:meth:`CostModel.forward_s`, :meth:`CostModel.prefill_token_s`)."""
        return self._costs

    def _prefill_budget(self, decode_batch: int, decode_kv_tokens: int) -> int:
        """Return this step's prefill token budget, shared by the prefilling requests.

        ``max_prefill_tokens``, or, for a scheduler that asks for ``balanced_prefill``
        while requests decode, only what the decode step's compute slack carries
        (:meth:`CostModel.prefill_slack_tokens`, at least one block): a big chunk runs
        at the same prefill rate (compute-bound either way) but holds every decoding
        request to one token per long step, so their blocks stay leased longer and
        fewer requests fit (figures: ``docs/design.md``, "Balanced batches"). Where even
        a one-sequence decode step hides less than a block (hardware that overlaps
        little of a step's compute with its memory reads, a CPU), the chunk stays whole:
        smaller chunks would hide no prefill and only spread it over more steps, each a
        full read of the weights.
        """
        budget = self.config.max_prefill_tokens
        if decode_batch and getattr(self.scheduler, "balanced_prefill", False):
            block = self.kv.config.block_size
            if self.cost.prefill_slack_tokens(1, 1) >= block:  # the hardware hides prefill
                slack = self.cost.prefill_slack_tokens(decode_batch, decode_kv_tokens)
                budget = min(budget, max(block, slack))
        return budget

    def _plan_prefill(self, budget: int) -> list[tuple[_Entry, int]]:
        chunks: list[tuple[_Entry, int]] = []
        for entry in self._running:
            if budget <= 0:
                break
            remaining = entry.prompt_tokens - entry.prefill_pos
            if remaining <= 0 or not self._loads_done(entry):
                continue
            n = min(remaining, budget)
            chunks.append((entry, n))
            budget -= n
        return chunks

    def _advance(self, chunks: list[tuple[_Entry, int]], decoding: list[_Entry]) -> None:
        now = now_s()
        # a request cancelled during the step has already left, its blocks released
        chunks = [(e, n) for e, n in chunks if not e.done.is_set()]
        decoding = [e for e in decoding if not e.done.is_set()]
        # balanced chunks are small: commit each one's full blocks so others can hit them
        commit_chunks = getattr(self.scheduler, "balanced_prefill", False)
        for entry, n in chunks:
            entry.prefill_pos += n
            self._prefill_tokens += n
            if entry.prefill_pos >= entry.prompt_tokens:
                assert entry.admission is not None
                self.kv.commit(entry.admission, entry.keys)
                entry.first_token_s = entry.first_token_s or now  # a resumption keeps its own
                entry.generated = 1
            elif commit_chunks:
                assert entry.admission is not None
                done = entry.keys[: entry.prefill_pos // self.kv.config.block_size]
                if len(done) > entry.admission.committed_blocks:
                    self.kv.commit(entry.admission, done)
        for entry in decoding:
            entry.generated += 1
            self._decode_tokens += 1
        for entry in [e for e in self._running if e.generated]:
            if self._stream(entry, entry.output[: entry.generated]):
                entry.output = entry.output[: entry.streamed]  # the caller ends it here
                self._finish(entry, now)
            elif entry.generated >= entry.request.max_new_tokens:
                self._finish(entry, now)

    def _finish(self, entry: _Entry, now: float) -> None:
        req, adm = entry.request, entry.admission
        assert adm is not None
        output = entry.output
        keys = block_keys(
            req.prompt_token_ids + output,
            self.kv.config.block_size,
            req.namespace,
            known=entry.keys,
        )
        self.kv.commit(adm, keys)
        self.kv.release(adm)
        self._running.remove(entry)
        entry.result = self._result(entry, output, now)
        entry.done.set()

    # -- retraction (§7.0) --------------------------------------------------------------

    def _retractable(self) -> list[_Entry]:
        """Running requests whose loads have landed (a commit needs its blocks resident)."""
        return [e for e in self._running if self._loads_done(e)]

    def _pause(self, entry: _Entry) -> list[int]:
        """Commit the full blocks computed so far: the prefilled part of the prompt, or
        the prompt and every generated token but the last (whose KV is not computed)."""
        adm = entry.admission
        assert adm is not None
        bs = self.kv.config.block_size
        output = list(entry.output[: entry.generated])
        if output:
            computed = entry.request.prompt_token_ids + tuple(output[:-1])
            keys = block_keys(computed, bs, entry.request.namespace, known=entry.keys)
        else:
            keys = entry.keys[: entry.prefill_pos // bs]
        if len(keys) > adm.committed_blocks:
            self.kv.commit(adm, keys)
        entry.prefill_pos = 0
        entry.generated = 0
        entry.output = ()
        return output

    # -- host link ------------------------------------------------------------------

    def _enqueue_load(self, load: LoadTransfer) -> None:
        """Queue a host-to-GPU copy on the single FIFO host link."""
        duration = self.cost.transfer_s(load.num_blocks * self.kv.config.bytes_per_block)
        start = max(now_s(), self._link_free_s)
        self._link_free_s = start + duration
        self._link_busy_s += duration
        self._pending_loads[load] = self._link_free_s

    def _complete_loads(self, now: float) -> None:
        if not self._pending_loads:
            return
        for load, done_s in sorted(self._pending_loads.items(), key=lambda kv: kv[1]):
            if done_s > now:
                break
            del self._pending_loads[load]
            self.kv.complete_load(load, ok=True)

    def _abandon_loads(self) -> None:
        for load in list(self._pending_loads):
            del self._pending_loads[load]
            self.kv.complete_load(load, ok=False)

    def _loads_done(self, entry: _Entry) -> bool:
        assert entry.admission is not None
        return not any(load in self._pending_loads for load in entry.admission.loads)

    def _prefetch(self, step_s: float) -> None:
        loads = self.kv.plan_prefetch(step_s)
        for load in loads:
            self._enqueue_load(load)
        if loads:
            self._prefetch_steps += 1


def _output_tokens(request: GenerateRequest) -> tuple[int, ...]:
    scripted = request.scripted_output_token_ids[: request.max_new_tokens]
    filler = request.max_new_tokens - len(scripted)
    return scripted + (0,) * filler
