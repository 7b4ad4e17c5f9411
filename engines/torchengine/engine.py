"""The real engine: a transformers causal LM over paged KV that the radix tree allocates (§7.2).

The scheduler has the sim engine's shape. Each step, on the trio thread: finish landed
host → device loads (``complete_load``), admit waiting requests through
``KVManager.try_admit`` (its evictions queue device → host copies through the demote
hook; its host hits queue loads), plan one prefill chunk budget plus one decode token
per decoding request, and in pure-decode steps with nothing waiting start conservative
prefetches. Then, in a worker thread (``trio.to_thread``, so the event loop stays free),
run the queued copies in order and the model. Back on the trio thread, ``commit`` what
was computed and finish requests.

A running request's KV lives in the device pool and nowhere else: its cached prefix in
the tree's blocks, the rest in the private blocks reserved at admission, written in place
as each token is computed (:class:`~pbkv.engines.torchengine.forward.PagedForward`), so
a commit hands the tree blocks that are already filled. Every step is one forward over
all its work, prefill chunks and one decode token per decoding request together, with
one LM head over the rows that emit a token and one device-to-host read of their greedy
picks.

A scheduler that asks for ``balanced_prefill`` (``workflow``, ``fcfs-balanced``) gets
the sim engine's stall-free batches: while requests decode, a step carries only the
prefill tokens whose marginal time fills one decode forward's (measured,
:class:`~pbkv.engines.torchengine.stepcost.StepCosts`), not the full chunk, and each
chunk's full blocks are committed as they land. A step's time is split into decode (what
its decode rows alone cost, measured on pure decode steps) and prefill (the rest); both
feed :attr:`prefill_share`, which the ``workflow`` scheduler's hold-back reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import trio

from pbkv.engines.base import EngineError, GenerateRequest
from pbkv.engines.constrained import request_constraint
from pbkv.engines.owned import OwnedCacheEngine, Queued
from pbkv.engines.scheduler import Scheduler
from pbkv.engines.torchengine.forward import PagedForward, Segment
from pbkv.engines.torchengine.model import KVLayout
from pbkv.engines.torchengine.pool import BlockCopy, CopyDone, PagedKVPools
from pbkv.engines.torchengine.stepcost import StepCosts
from pbkv.kvmanager import (
    Admission,
    KVConfig,
    KVManager,
    LoadTransfer,
    Node,
    block_keys,
)
from pbkv.runtime.clock import now_s

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TorchEngineConfig:
    """Scheduler limits of the torch engine.

    Args:
        max_batch_size: most requests running at once (prefilling or decoding).
        max_prefill_tokens: prefill tokens per step, shared by the requests prefilling
            (chunked prefill keeps decodes moving during a long prompt); with a
            ``balanced_prefill`` scheduler, the cap on the measured stall-free budget.
        stop_token_ids: generation stops early at any of these; ``None`` = the model's
            ``eos_token_id``; ``()`` = always generate ``max_new_tokens``.
        check_integrity: assert the KV manager's invariants after every step (tests).
    """

    max_batch_size: int = 8
    max_prefill_tokens: int = 512
    stop_token_ids: tuple[int, ...] | None = None
    check_integrity: bool = False


@dataclass(frozen=True, slots=True)
class TorchStatistics:
    """Engine counters; times are wall-clock seconds.

    ``copy_s``, ``prefill_s`` and ``decode_s`` are the worker thread's time in each part
    of the steps (a forward that carries both is split as
    :meth:`TorchEngine._note_costs` says); ``busy_s`` is the steps' whole time, the
    hand-off to the worker thread and back included (so the parts sum to at most it).
    ``forwards`` counts model forwards (one per step that computes; more only where a
    failed forward is run again row by row); ``decode_forwards`` those that carried
    decodes (``decode_tokens`` over it is the mean decode batch); ``h2d_blocks`` /
    ``d2h_blocks`` count blocks queued for copy.
    """

    steps: int
    prefill_tokens: int
    decode_tokens: int
    decode_forwards: int
    prefill_s: float
    decode_s: float
    copy_s: float
    h2d_blocks: int
    d2h_blocks: int
    prefetch_steps: int
    retractions: int = 0
    busy_s: float = 0.0
    forwards: int = 0


@dataclass(slots=True)
class _Counters:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_forwards: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    copy_s: float = 0.0
    h2d_blocks: int = 0
    d2h_blocks: int = 0
    prefetch_steps: int = 0
    busy_s: float = 0.0
    forwards: int = 0


def make_kv_config(
    model: PreTrainedModel,
    *,
    block_size: int,
    gpu_capacity_blocks: int,
    host_capacity_blocks: int,
    policy: str = "pbkv",
    bandwidth_bytes_per_s: float = 0.0,
    horizon: int = 3,
    gamma: float = 0.8,
) -> KVConfig:
    """Return a :class:`KVConfig` whose ``bytes_per_block`` is ``model``'s (at its dtype).

    Args:
        bandwidth_bytes_per_s: host → device copy rate, for the prefetch budget.
        (others): as :class:`KVConfig`.
    """
    layout = KVLayout.of(model.config, block_size, next(model.parameters()).dtype)
    return KVConfig(
        block_size=block_size,
        gpu_capacity_blocks=gpu_capacity_blocks,
        host_capacity_blocks=host_capacity_blocks,
        bytes_per_block=layout.bytes_per_block,
        policy=policy,
        horizon=horizon,
        gamma=gamma,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
    )


@dataclass(eq=False)
class _Entry(Queued):
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
class _Chunk:
    """``tokens`` prompt tokens of ``entry`` to prefill."""

    entry: _Entry
    tokens: int


@dataclass(frozen=True, slots=True)
class _Row:
    """One request's work in a step's forward: its segment (a chunk or a decode token)."""

    entry: _Entry
    segment: Segment

    @property
    def emits(self) -> bool:
        """Whether this row ends in a token to sample (a decode, or a prompt's end)."""
        return self.segment.end >= self.entry.prompt_tokens


@dataclass(frozen=True, slots=True)
class _StepPlan:
    copies: list[BlockCopy]
    prefills: list[_Chunk]
    decodes: list[_Entry]
    rows: list[_Row] = field(default_factory=list)  # the forward's work, in order

    @property
    def empty(self) -> bool:
        return not (self.copies or self.prefills or self.decodes)


@dataclass(frozen=True, slots=True)
class _Executed:
    """What one step's worker run gave back: the copies' completion, the requests whose
    own work raised, and the worker's seconds in copies and in the forward."""

    done: CopyDone
    failed: dict[_Entry, Exception]
    copy_s: float
    forward_s: float


@dataclass(eq=False, slots=True)
class _Inflight:
    """A load whose copies are queued (``done is None``) or issued."""

    load: LoadTransfer
    done: CopyDone | None = None


class TorchEngine(OwnedCacheEngine[_Entry]):
    """Owned-cache engine over a transformers causal LM (see the module docstring).

    Args:
        kv: the KV manager whose tree allocates both pools; the engine installs its
            demote hook. ``kv.config.block_size`` is the page size.
        model: a Llama-family transformers ``*ForCausalLM`` (e.g. from
            :func:`load_model`; see :mod:`~pbkv.engines.torchengine.forward`), in eval
            mode; its device and dtype are the pools'.
        config: scheduler limits.
        scheduler: admission order (see :class:`~pbkv.engines.owned.OwnedCacheEngine`).

    Raises:
        ValueError: ``kv.config.bytes_per_block`` is set and is not the model's, the
            model is not Llama-family, or an unknown scheduler name.
    """

    entry_type = _Entry
    has_hidden_state = True
    samples_tokens = True
    constrains_tokens = True
    """A constrained request's grammar masks the logits at each token
    (:func:`pbkv.engines.constrained.request_constraint`)."""

    def __init__(
        self,
        kv: KVManager,
        model: PreTrainedModel,
        config: TorchEngineConfig | None = None,
        *,
        scheduler: str | Scheduler = "fcfs",
    ) -> None:
        weight = next(model.parameters())
        self.layout = KVLayout.of(model.config, kv.config.block_size, weight.dtype)
        bpb = kv.config.bytes_per_block
        if bpb and bpb != self.layout.bytes_per_block:
            raise ValueError(
                f"kv.config.bytes_per_block is {bpb}; the model's is "
                f"{self.layout.bytes_per_block} (use make_kv_config)"
            )
        self.config = config or TorchEngineConfig()
        super().__init__(kv, self.config.max_batch_size, scheduler)
        self.model = model
        self.device = weight.device
        self.pools = PagedKVPools(
            self.layout, kv.config.gpu_capacity_blocks, kv.config.host_capacity_blocks, self.device
        )
        self._paged = PagedForward(model, self.pools)
        self._head = model.get_output_embeddings()
        self._stop = _stop_tokens(self.config.stop_token_ids, model)
        self._vocab = int(model.config.vocab_size)
        self._max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._copies: list[BlockCopy] = []
        self._inflight: deque[_Inflight] = deque()
        self._loading: set[LoadTransfer] = set()
        self._decode_step_s = 0.05
        self.costs = StepCosts()
        """Measured step costs; they size balanced batches (:meth:`_prefill_budget`)."""
        self._counters = _Counters()
        kv.set_demote_hook(self._on_demote)

    # -- public ---------------------------------------------------------------------

    def statistics(self) -> TorchStatistics:
        """Return the engine's counters. Does not modify the engine."""
        return TorchStatistics(**dataclasses.asdict(self._counters), retractions=self._retractions)

    def _validate(self, request: GenerateRequest) -> None:
        """Also reject token ids outside the vocabulary and sequences past the positions."""
        super()._validate(request)
        rid, prompt = request.request_id, request.prompt_token_ids
        if min(prompt) < 0 or max(prompt) >= self._vocab:
            raise ValueError(f"request {rid}: prompt_token_ids outside [0, {self._vocab})")
        if len(prompt) + request.max_new_tokens > self._max_positions:
            raise ValueError(
                f"request {rid}: {len(prompt)} + {request.max_new_tokens} tokens exceed the "
                f"model's {self._max_positions} positions"
            )

    # -- one scheduler step (trio thread) ---------------------------------------------

    async def _step(self) -> None:
        self._complete_loads()
        self._admit()
        plan = self._plan()
        if plan.empty:
            await self._idle()
            return
        if plan.decodes and not plan.prefills and not self._waiting:
            self._prefetch()  # idle space and idle bandwidth only (§5.4)
            plan = dataclasses.replace(plan, copies=self._take_copies(plan.copies))
        started = now_s()
        busy_from = time.perf_counter()
        self._executing = True
        try:
            ran = await trio.to_thread.run_sync(self._execute, plan)
        except BaseException as exc:
            self._executing = False
            stopped = isinstance(exc, trio.Cancelled)
            message = (
                "engine stopped" if stopped else f"engine step failed: {type(exc).__name__}: {exc}"
            )
            self._fail_all(EngineError(message))
            self._abandon_copies(plan.copies)
            raise
        self._executing = False
        self._counters.busy_s += time.perf_counter() - busy_from
        self._note_costs(plan, ran)
        for item in self._inflight:
            if item.done is None:
                item.done = ran.done
        if plan.decodes and not plan.prefills:
            self._decode_step_s = 0.8 * self._decode_step_s + 0.2 * (now_s() - started)
        if ran.failed:
            plan = self._fail_requests(plan, ran.failed)
        self._apply(plan)
        self._reap_cancelled()  # after _apply: what they computed is committed first
        self._counters.steps += 1
        if self.config.check_integrity:
            self.kv.check_integrity()

    async def _idle(self) -> None:
        started_s = now_s()
        if self._inflight:  # copies in flight on a CUDA stream: poll them
            await trio.sleep(0.0005)
        else:
            await self._wait_for_work()
        self._note_idle(now_s() - started_s)

    def _note_costs(self, plan: _StepPlan, ran: _Executed) -> None:
        """Split a step's forward into decode and prefill seconds; fold them into
        :attr:`costs`, the counters and :attr:`prefill_share`.

        The decode rows of a mixed step are billed what a pure decode forward costs
        now (:attr:`StepCosts.decode_step_s`, at most the forward), the prefill tokens
        the rest: their marginal time, the figure balanced batches are sized by.
        """
        prefill_tokens = sum(c.tokens for c in plan.prefills)
        if plan.decodes and not prefill_tokens:
            decode_s = ran.forward_s
        elif plan.decodes:
            decode_s = min(ran.forward_s, self.costs.decode_step_s or 0.0)
        else:
            decode_s = 0.0
        prefill_s = ran.forward_s - decode_s
        self.costs.observe(prefill_tokens, prefill_s, decode_s if not prefill_tokens else 0.0)
        self._counters.copy_s += ran.copy_s
        self._counters.prefill_s += prefill_s
        self._counters.decode_s += decode_s
        self._note_busy(ran.copy_s + ran.forward_s, prefill_s)

    def _start(self, entry: _Entry, admission: Admission) -> None:
        entry.admission = admission
        cached = admission.matched_blocks * self.kv.config.block_size
        entry.pos = min(cached, entry.prompt_tokens - 1)  # recompute >= 1 token for logits
        entry.write_from = cached  # a recomputed last token sits in a shared block
        for load in admission.loads:
            if load not in self._loading:
                self._queue_load(load)
        self._running.append(entry)

    def _prefill_budget(self, decode_batch: int) -> int:
        """Return this step's prefill token budget, shared by the prefilling requests.

        ``max_prefill_tokens``, or, for a scheduler that asks for ``balanced_prefill``
        while requests decode, the tokens whose marginal prefill time fills one decode
        forward's (:meth:`StepCosts.prefill_slack_tokens`, at least one block; one block
        until both are measured), as the sim engine's ``_prefill_budget`` does with its
        cost model: a full chunk holds every decoding request to one token per long
        step.
        """
        budget = self.config.max_prefill_tokens
        if decode_batch and getattr(self.scheduler, "balanced_prefill", False):
            slack = self.costs.prefill_slack_tokens() or 0
            budget = min(budget, max(self.kv.config.block_size, slack))
        return budget

    def _commits_chunks(self) -> bool:
        """Whether each prefill chunk's full blocks are stored and committed as it lands:
        balanced chunks are small, and others can hit (and the ``workflow`` scheduler
        stops holding a request back for) what is committed."""
        return bool(getattr(self.scheduler, "balanced_prefill", False))

    def _plan(self) -> _StepPlan:
        decodes = [e for e in self._running if e.prefilled and not e.finished]
        budget = self._prefill_budget(len(decodes))
        prefills: list[_Chunk] = []
        for entry in self._running:
            if budget <= 0:
                break
            if entry.prefilled or not self._loads_done(entry):
                continue
            n = min(entry.prompt_tokens - entry.pos, budget)
            prefills.append(_Chunk(entry, n))
            budget -= n
        rows = [self._prefill_row(c) for c in prefills] + [self._decode_row(e) for e in decodes]
        return _StepPlan(self._take_copies([]), prefills, decodes, rows)

    def _prefill_row(self, chunk: _Chunk) -> _Row:
        entry = chunk.entry
        ids = entry.request.prompt_token_ids[entry.pos : entry.pos + chunk.tokens]
        return _Row(entry, Segment(ids, entry.pos, self._blocks(entry), entry.write_from))

    def _decode_row(self, entry: _Entry) -> _Row:
        """Feed the last output token, whose KV is not computed yet."""
        at = entry.prompt_tokens + len(entry.output) - 1
        return _Row(entry, Segment((entry.output[-1],), at, self._blocks(entry), entry.write_from))

    def _apply(self, plan: _StepPlan) -> None:
        now = now_s()
        for chunk in plan.prefills:
            entry = chunk.entry
            self._counters.prefill_tokens += chunk.tokens
            assert entry.admission is not None
            if entry.prefilled and not entry.prompt_committed:
                self.kv.commit(entry.admission, entry.keys)
                entry.prompt_committed = True
                entry.first_token_s = entry.first_token_s or now  # a resumption keeps its own
            elif self._commits_chunks():
                full = entry.pos // self.kv.config.block_size
                if full > entry.admission.committed_blocks:
                    self.kv.commit(entry.admission, entry.keys[:full])
        self._counters.decode_tokens += len(plan.decodes)
        self._counters.decode_forwards += 1 if plan.decodes else 0
        for entry in self._running:
            if self._stream(entry, entry.output) and not entry.finished:
                self._end_here(entry)
        for entry in [e for e in self._running if e.finished]:
            self._finish(entry, now)

    def _end_here(self, entry: _Entry) -> None:
        """Finish ``entry`` at its last streamed token, as its caller asked (a stop
        sequence). Runs on the trio thread between steps (as :meth:`_pause` does)."""
        del entry.output[entry.streamed :]  # none in practice: one token per step
        entry.finished = True

    def _finish(self, entry: _Entry, now: float) -> None:
        """Commit the sequence's full blocks (written in place), release, and answer."""
        req, adm = entry.request, entry.admission
        assert adm is not None
        computed = req.prompt_token_ids + tuple(entry.output[:-1])  # the last has no KV yet
        keys = block_keys(computed, self.kv.config.block_size, req.namespace, known=entry.keys)
        self.kv.commit(adm, keys)
        self.kv.release(adm)
        self._running.remove(entry)
        entry.result = self._result(entry, entry.output, now, entry.hidden)
        entry.done.set()

    # -- retraction (§7.0, trio thread, between steps) ------------------------------------

    def _retractable(self) -> list[_Entry]:
        """Running requests whose loads have landed and that will not finish this step.

        Called before admission, so none of them holds blocks freed by this step's
        evictions (whose device-to-host copies are still queued).
        """
        return [e for e in self._running if self._loads_done(e) and not e.finished]

    def _pause(self, entry: _Entry) -> list[int]:
        """Commit the full blocks computed so far (already in place): the prefilled part
        of the prompt, or the prompt and every output token but the last (whose KV is
        not computed yet); reset the request to run again.

        The sampling generator is kept, so a sampled request draws the same tokens.
        """
        adm = entry.admission
        assert adm is not None
        output = list(entry.output)
        computed = entry.prompt_tokens + len(output) - 1 if output else entry.pos
        seq = entry.request.prompt_token_ids + tuple(output[:-1])
        bs = self.kv.config.block_size
        keys = block_keys(seq, bs, entry.request.namespace, known=entry.keys)
        keys = keys[: computed // bs]
        if len(keys) > adm.committed_blocks:
            self.kv.commit(adm, keys)
        entry.write_from = 0
        entry.prompt_committed = False
        entry.pos = 0
        entry.output = []
        entry.finished = False
        return output

    def _fail_requests(self, plan: _StepPlan, failed: dict[_Entry, Exception]) -> _StepPlan:
        """Fail the requests whose own work raised in the step; return the plan without them.

        Each fails alone with :class:`EngineError` (its lease and reservation released,
        what it committed before kept), so one request's fault costs neither the rest of
        the batch nor the engine's restart budget (see :meth:`_execute`).
        """
        for entry, exc in failed.items():
            log.warning("request %s failed in a step: %r", entry.request.request_id, exc)
            if entry in self._running:
                self._running.remove(entry)
            if not entry.done.is_set():
                message = f"request {entry.asked.request_id}: {type(exc).__name__}: {exc}"
                self._fail(entry, EngineError(message))
        return _StepPlan(
            plan.copies,
            [c for c in plan.prefills if c.entry not in failed],
            [e for e in plan.decodes if e not in failed],
            [r for r in plan.rows if r.entry not in failed],
        )

    def _abandon_loads(self) -> None:
        # Copies already issued on the copy stream will land in their blocks whatever
        # happens: wait for them and mark them resident, so no block is handed out again
        # while a copy still writes into it. The rest never ran: fail them.
        for item in [i for i in self._inflight if i.done is not None]:
            item.done.wait()
        self._complete_loads()
        self._abandon_copies(())

    def _abandon_copies(self, copies: Sequence[BlockCopy]) -> None:
        """After a failed step: fail the loads that did not land and forget host copies
        whose device-to-host copy may not have run, so no node is left resident on
        data that was never copied (§5.1, §10).

        The step may have issued some of its copies on the copy stream before it failed;
        they are waited for first, so that no block is freed while a copy still writes
        into it.
        """
        self.pools.synchronize()
        for item in [i for i in self._inflight if i.done is None]:
            self._inflight.remove(item)
            self._loading.discard(item.load)
            self.kv.complete_load(item.load, ok=False)
        demoted = {b for c in [*copies, *self._copies] if c.to_host for b in c.dst_blocks}
        self._copies = []
        if demoted:
            self.kv.discard_host_blocks(demoted)

    def _blocks(self, entry: _Entry) -> list[int]:
        """Return the device blocks of ``entry``'s sequence, in order: the tree's for
        what it committed or matched (its lease's path, all landed), then its reserved
        private blocks.

        Read every step: a commit may hand the tree a block it already held, and the
        request reads the tree's copy from then on (its own is freed).
        """
        adm = entry.admission
        assert adm is not None
        chain: list[Node] = []
        node: Node | None = adm.lease.node
        while node is not None and not node.is_root:
            chain.append(node)
            node = node.parent
        blocks = [b for n in reversed(chain) for b in (n.gpu_blocks or ())]
        if len(blocks) != adm.committed_blocks:
            raise AssertionError(
                f"sequence of {entry.request.request_id}: {len(blocks)} GPU blocks on its "
                f"path, {adm.committed_blocks} committed"
            )
        return blocks + adm.private_blocks

    # -- tier copies (trio thread queues, worker runs) ---------------------------------

    def _on_demote(self, node: Node, gpu_blocks: list[int], host_blocks: list[int]) -> None:
        """Demote hook: queue the device → host copy ahead of any reuse of ``gpu_blocks``."""
        self._copies.append(BlockCopy(True, tuple(gpu_blocks), tuple(host_blocks)))
        self._counters.d2h_blocks += len(gpu_blocks)

    def _queue_load(self, load: LoadTransfer) -> None:
        for node, dst in zip(load.nodes, load.gpu_blocks, strict=True):
            assert node.host_blocks is not None
            self._copies.append(BlockCopy(False, tuple(node.host_blocks), tuple(dst)))
        self._inflight.append(_Inflight(load))
        self._loading.add(load)
        self._counters.h2d_blocks += load.num_blocks

    def _take_copies(self, already: list[BlockCopy]) -> list[BlockCopy]:
        copies, self._copies = already + self._copies, []
        return copies

    def _complete_loads(self) -> None:
        """Mark landed loads resident, in issue order (a chain's parent lands first)."""
        while self._inflight:
            item = self._inflight[0]
            if item.done is None or not item.done.ready():
                return
            self._inflight.popleft()
            self._loading.discard(item.load)
            self.kv.complete_load(item.load, ok=True)

    def _loads_done(self, entry: _Entry) -> bool:
        assert entry.admission is not None
        return not any(load in self._loading for load in entry.admission.loads)

    def _prefetch(self) -> None:
        loads = self.kv.plan_prefetch(self._decode_step_s)
        for load in loads:
            self._queue_load(load)
        if loads:
            self._counters.prefetch_steps += 1

    # -- the worker thread: copies and model ---------------------------------------------

    def _execute(self, plan: _StepPlan) -> _Executed:
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
        failed: dict[_Entry, Exception] = {}
        with torch.inference_mode():
            t0 = time.perf_counter()
            done = self.pools.copy(plan.copies) if plan.copies else CopyDone(None)
            t1 = time.perf_counter()
            ran = self._run_rows(plan.rows, failed) if plan.rows else 0
            self._wait_for_compute()  # so the forward's time is its own
            t2 = time.perf_counter()
        if failed and not ran:
            raise next(iter(failed.values()))
        return _Executed(done, failed, t1 - t0, t2 - t1)

    def _wait_for_compute(self) -> None:
        """Wait for the kernels queued on the compute stream (not the copy stream's)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _run_rows(self, rows: list[_Row], failed: dict[_Entry, Exception]) -> int:
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

    def _forward(self, rows: list[_Row]) -> torch.Tensor:
        """Run ``rows``' segments in one packed forward (their KV lands in the pool).

        Shapes:
            return: the post-norm hidden state of each row's last token,
            ``(len(rows), d_model)``.
        """
        self._counters.forwards += 1
        return self._paged([row.segment for row in rows])

    def _advance(
        self, rows: list[_Row], hidden: torch.Tensor, failed: dict[_Entry, Exception]
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

    def _sample(self, entry: _Entry, logits: torch.Tensor, argmax: int) -> int:
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


def _stop_tokens(configured: tuple[int, ...] | None, model: PreTrainedModel) -> frozenset[int]:
    if configured is not None:
        return frozenset(configured)
    eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)
