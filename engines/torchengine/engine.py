"""The real engine: a transformers causal LM over paged KV that the radix tree allocates (§7.2).

The scheduler has the sim engine's shape. Each step, on the trio thread: finish landed
host → device loads (``complete_load``), admit waiting requests through
``KVManager.try_admit`` (its evictions queue device → host copies through the demote
hook; its host hits queue loads), plan one prefill chunk budget plus one decode token
per decoding request, and in pure-decode steps with nothing waiting start conservative
prefetches. Then, in a worker thread (``trio.to_thread``, so the event loop stays free),
run the queued copies in order and the model (:class:`~pbkv.engines.torchengine.worker.StepWorker`).
Back on the trio thread, ``commit`` what was computed and finish requests.

A running request's KV lives in the device pool and nowhere else: its cached prefix in
the tree's blocks, the rest in the private blocks reserved at admission, written in place
as each token is computed (:class:`~pbkv.engines.torchengine.forward.PagedForward`), so
a commit hands the tree blocks that are already filled. Every step is one forward over
all its work, prefill chunks and one decode token per decoding request together, with
one LM head over the rows that emit a token and one device-to-host read of their greedy
picks.

A scheduler that asks for ``balanced_prefill`` (``workflow``, ``fcfs-balanced``) gets
the sim engine's stall-free batches: while requests decode, a step carries only the
prefill tokens a decode forward hides (measured,
:class:`~pbkv.engines.torchengine.stepcost.StepCosts`; on a CPU none, and the chunk then
stays whole), not the full chunk, and each chunk's full blocks are committed as they
land. A step's time is split into decode (what its decode rows alone cost, measured on
pure decode steps) and prefill (the rest); both feed :attr:`prefill_share`, which the
``workflow`` scheduler's hold-back reads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from pbkv.engines.admission import ForwardCosts
from pbkv.engines.base import EngineError, GenerateRequest
from pbkv.engines.owned import OwnedCacheEngine
from pbkv.engines.scheduler import Scheduler
from pbkv.engines.torchengine.config import (
    Counters,
    TorchEngineConfig,
    TorchStatistics,
    make_kv_config,
)
from pbkv.engines.torchengine.forward import Segment
from pbkv.engines.torchengine.model import KVLayout
from pbkv.engines.torchengine.pool import BlockCopy, CopyDone, PagedKVPools
from pbkv.engines.torchengine.stepcost import StepCosts
from pbkv.engines.torchengine.worker import (
    Chunk,
    Entry,
    Executed,
    Row,
    StepPlan,
    StepWorker,
    stop_tokens,
)
from pbkv.kvmanager import Admission, KVManager, LoadTransfer, Node, block_keys
from pbkv.runtime.clock import now_s

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TorchEngine", "TorchEngineConfig", "TorchStatistics", "make_kv_config"]

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Inflight:
    """A load whose copies are queued (``done is None``) or issued."""

    load: LoadTransfer
    done: CopyDone | None = None


class TorchEngine(OwnedCacheEngine[Entry]):
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

    entry_type = Entry
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
        self.worker = StepWorker(model, self.pools, stop_tokens(self.config.stop_token_ids, model))
        """Runs each step's copies and forward in a worker thread."""
        self._vocab = int(model.config.vocab_size)
        self._max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._copies: list[BlockCopy] = []
        self._inflight: deque[_Inflight] = deque()
        self._loading: set[LoadTransfer] = set()
        self._decode_step_s = 0.05
        self.costs = StepCosts()
        """Measured step costs; they size balanced batches (:meth:`_prefill_budget`)."""
        self._counters = Counters()
        kv.set_demote_hook(self._on_demote)

    # -- public ---------------------------------------------------------------------

    def statistics(self) -> TorchStatistics:
        """Return the engine's counters. Does not modify the engine."""
        return TorchStatistics(
            **dataclasses.asdict(self._counters),
            retractions=self._retractions,
            forwards=self.worker.forwards,
        )

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
            ran = await trio.to_thread.run_sync(self.worker.execute, plan)
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

    def _note_costs(self, plan: StepPlan, ran: Executed) -> None:
        """Split a step's forward into decode and prefill seconds; fold them into
        :attr:`costs`, the counters and :attr:`prefill_share`.

        The decode rows of a mixed step are billed what a pure decode forward costs now
        (:attr:`StepCosts.decode_step_s`, :meth:`StepCosts.observe`), the prefill tokens
        the rest: their marginal time, the figure balanced batches are sized by.
        """
        prefill_tokens = sum(c.tokens for c in plan.prefills)
        decode_s = self.costs.observe(prefill_tokens, len(plan.decodes), ran.forward_s)
        prefill_s = ran.forward_s - decode_s
        self._counters.copy_s += ran.copy_s
        self._counters.prefill_s += prefill_s
        self._counters.decode_s += decode_s
        self._note_busy(ran.copy_s + ran.forward_s, prefill_s)

    def _start(self, entry: Entry, admission: Admission) -> None:
        entry.admission = admission
        cached = admission.matched_blocks * self.kv.config.block_size
        entry.pos = min(cached, entry.prompt_tokens - 1)  # recompute >= 1 token for logits
        entry.write_from = cached  # a recomputed last token sits in a shared block
        for load in admission.loads:
            if load not in self._loading:
                self._queue_load(load)
        self._running.append(entry)

    def _forward_costs(self) -> ForwardCosts | None:
        """Return the measured forward and prefill-token seconds
        (:attr:`StepCosts.forward_s`, :attr:`StepCosts.prefill_s_per_token`); ``None``
        until both are measured."""
        forward_s, token_s = self.costs.forward_s, self.costs.prefill_s_per_token
        if forward_s is None or token_s is None:
            return None
        return ForwardCosts(forward_s, token_s)

    def _prefill_budget(self, decode_batch: int) -> int:
        """Return this step's prefill token budget, shared by the prefilling requests.

        ``max_prefill_tokens``, or, for a scheduler that asks for ``balanced_prefill``
        while requests decode, the prefill tokens a decode forward carries without
        taking longer (:meth:`StepCosts.prefill_slack_tokens`), as the sim engine's
        ``_prefill_budget`` does with its cost model: a full chunk holds every decoding
        request to one token per long step. Where a decode forward hides less than one
        block (a CPU runs a token's compute whatever runs beside it), or until that is
        measured, the chunk stays whole: smaller chunks would hide no prefill and only
        spread it over more forwards, each a full read of the weights. The budget is the
        measured slack plus one block: only chunks of at least the estimate test it, so
        the block above is the probe that follows a slack that grows or shrinks.
        """
        budget = self.config.max_prefill_tokens
        if decode_batch and getattr(self.scheduler, "balanced_prefill", False):
            slack = self.costs.prefill_slack_tokens()
            block = self.kv.config.block_size
            if slack is not None and slack >= block:
                budget = min(budget, slack + block)
        return budget

    def _commits_chunks(self) -> bool:
        """Whether each prefill chunk's full blocks are stored and committed as it lands:
        balanced chunks are small, and others can hit (and the ``workflow`` scheduler
        stops holding a request back for) what is committed."""
        return bool(getattr(self.scheduler, "balanced_prefill", False))

    def _plan(self) -> StepPlan:
        decodes = [e for e in self._running if e.prefilled and not e.finished]
        budget = self._prefill_budget(len(decodes))
        prefills: list[Chunk] = []
        for entry in self._running:
            if budget <= 0:
                break
            if entry.prefilled or not self._loads_done(entry):
                continue
            n = min(entry.prompt_tokens - entry.pos, budget)
            prefills.append(Chunk(entry, n))
            budget -= n
        rows = [self._prefill_row(c) for c in prefills] + [self._decode_row(e) for e in decodes]
        return StepPlan(self._take_copies([]), prefills, decodes, rows)

    def _prefill_row(self, chunk: Chunk) -> Row:
        entry = chunk.entry
        ids = entry.request.prompt_token_ids[entry.pos : entry.pos + chunk.tokens]
        return Row(entry, Segment(ids, entry.pos, self._blocks(entry), entry.write_from))

    def _decode_row(self, entry: Entry) -> Row:
        """Feed the last output token, whose KV is not computed yet."""
        at = entry.prompt_tokens + len(entry.output) - 1
        return Row(entry, Segment((entry.output[-1],), at, self._blocks(entry), entry.write_from))

    def _apply(self, plan: StepPlan) -> None:
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

    def _end_here(self, entry: Entry) -> None:
        """Finish ``entry`` at its last streamed token, as its caller asked (a stop
        sequence). Runs on the trio thread between steps (as :meth:`_pause` does)."""
        del entry.output[entry.streamed :]  # none in practice: one token per step
        entry.finished = True

    def _finish(self, entry: Entry, now: float) -> None:
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

    def _retractable(self) -> list[Entry]:
        """Running requests whose loads have landed and that will not finish this step.

        Called before admission, so none of them holds blocks freed by this step's
        evictions (whose device-to-host copies are still queued).
        """
        return [e for e in self._running if self._loads_done(e) and not e.finished]

    def _pause(self, entry: Entry) -> list[int]:
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

    def _fail_requests(self, plan: StepPlan, failed: dict[Entry, Exception]) -> StepPlan:
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
        return StepPlan(
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

    def _blocks(self, entry: Entry) -> list[int]:
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

    def _loads_done(self, entry: Entry) -> bool:
        assert entry.admission is not None
        return not any(load in self._loading for load in entry.admission.loads)

    def _prefetch(self) -> None:
        loads = self.kv.plan_prefetch(self._decode_step_s)
        for load in loads:
            self._queue_load(load)
        if loads:
            self._counters.prefetch_steps += 1
