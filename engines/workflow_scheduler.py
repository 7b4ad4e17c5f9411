"""pbkv's ``workflow`` scheduler: the oldest workflow first, cached work ahead, and a cohort
of workflows whose contexts fit (§7.0).

Requests are ranked by the share of their prompt cached or loading (in bands), then by
workflow age (a workflow's start ordinal in the KV manager, the order queue-aware
eviction keeps), then arrival. Requests of workflows outside the *cohort* (the oldest
workflows whose contexts fit in the cache together) are held back while the GPU has
other work: when every running workflow's context cannot stay cached, running them all
makes reuse cyclic (each context is evicted just before its next step), so the cohort
keeps its contexts and the rest wait their turn. A held-back request is no near use of
its prefix, so queue-aware eviction does not count it (its walk still ranks it): an
older workflow's context between two tool calls comes back and goes first, so a younger
workflow's waiting prompt must not outrank it (figures: ``docs/design.md``).

Batches are *balanced* (stall-free): while requests decode, a step carries only the
prefill tokens that fit in the decode step's idle compute (Sarathi-Serve's token
budget, Agrawal et al., OSDI 2024). The prefill rate is the same (the GPU stays
compute-bound), but decodes no longer stall, so requests give their blocks back sooner
and more of them fit (figures: ``docs/design.md``). Small chunks stretch a prefill over
many steps, so the engine commits each chunk's full blocks as it lands, and the
scheduler holds a request whose next uncached block a running request is computing
(:meth:`KVManager.prefix_in_flight`) until it is committed: otherwise two workflows'
requests for one role prompt would both compute it (SGLang's in-batch prefix caching
does the same within a batch).

It can also *retract* (``preempt=True``, registered as ``workflow-retract``; SGLang's
word, vLLM's preemption by recompute): when the request that must go next (a starving
one, or the best ranked) does not fit, running requests of younger workflows are paused
to make room, youngest first. The engine commits what each computed (so its KV stays
cached, and under pressure is demoted to the host tier by ordinary eviction rather than
dropped), releases its lease and reservation, and queues it again to resume from its
prompt plus the tokens it had generated. A request is retracted at most
``max_retractions`` times, and only when the retraction certainly makes the waiting
request fit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TypeVar

from pbkv.engines.admission import ForwardCosts, Running, Waiting
from pbkv.engines.ranked import (
    _NONE,
    DEFAULT_MAX_BYPASS,
    DEFAULT_MAX_RETRACTIONS,
    _age,
    _RankedScheduler,
    _same,
    fewest_victims,
)
from pbkv.kvmanager import KVManager
from pbkv.kvmanager.node import NO_WORKFLOW

E = TypeVar("E", bound=Waiting)
R = TypeVar("R", bound=Running)

DEFAULT_COHORT_FILL = 0.5
"""Share of GPU + host capacity the workflow scheduler's cohort may fill (> 0): too
small a cohort idles the GPU, too large makes reuse cyclic. Chosen on hover at c=72 and
swebench at c=24 (the sweep: ``docs/design.md``)."""


class WorkflowScheduler(_RankedScheduler):
    """Oldest workflow first; a mostly cached request ahead of one that mostly recomputes.

    A request's *value* is the share of its prompt cached or loading. Requests are
    ranked by value band (``value_bands`` equal bands, the top band first), then by
    workflow age (the KV manager's start ordinal, the ranking queue-aware eviction also
    reads), then arrival. ``value_bands=1``
    ranks by age alone.

    With ``preempt``, a request that goes next and does not fit retracts running
    requests of younger workflows (see :meth:`victims`). Off by default, since it costs
    more than it gains at the paper's hover load (``docs/design.md``): a retraction
    shrinks the decode batch and its KV is reloaded or recomputed, and under closed-loop
    load latency follows throughput, not the order workflows are served in.

    Args:
        max_bypass: see :class:`_RankedScheduler`.
        value_bands: bands of the cached share, >= 1.
        cohort_fill: share of GPU + host capacity the cohort's contexts may fill
            (``None``: no cohort, nothing held back), > 0.
        preempt: retract younger workflows' running requests for the one that goes next.
        max_retractions: times one request may be retracted, >= 0.
        balanced_prefill: ask the engine for stall-free batches (see the module
            docstring).

    Raises:
        ValueError: ``value_bands < 1``, ``cohort_fill <= 0``, or negative
            ``max_bypass`` or ``max_retractions``.
    """

    name = "workflow"

    def __init__(
        self,
        max_bypass: int = DEFAULT_MAX_BYPASS,
        value_bands: int = 2,
        cohort_fill: float | None = DEFAULT_COHORT_FILL,
        *,
        engage_share: float = 0.5,
        release_share: float = 0.3,
        preempt: bool = False,
        max_retractions: int = DEFAULT_MAX_RETRACTIONS,
        balanced_prefill: bool = True,
    ) -> None:
        super().__init__(
            max_bypass,
            preempt=preempt,
            max_retractions=max_retractions,
            balanced_prefill=balanced_prefill,
        )
        if not 0.0 <= release_share <= engage_share <= 1.0:
            raise ValueError(
                f"need 0 <= release_share <= engage_share <= 1, got {release_share}, {engage_share}"
            )
        if value_bands < 1:
            raise ValueError(f"value_bands must be >= 1, got {value_bands}")
        if cohort_fill is not None and cohort_fill <= 0:
            raise ValueError(f"cohort_fill must be > 0 or None, got {cohort_fill}")
        self.value_bands = value_bands
        self.cohort_fill = cohort_fill
        self.engage_share = engage_share
        self.release_share = release_share
        self._engaged = False
        self._context_tokens: dict[str, int] = {}
        # the active workflows by age, kept until the active set changes
        self._kv: KVManager | None = None
        self._active: list[str] = []
        self._active_version = -1  # the ScoreBoard.workflows_version _active was read at
        self._by_age: list[str] = []
        self._live: set[str] = set()
        # the last deferred() and rank() answers, reused while nothing they read changed
        self._held: set[int] = set()
        self._held_for: list[Waiting] = []
        self._ranked: list[Waiting] = []
        self._ranked_for: list[Waiting] = []
        self._ranked_ages: list[int] = []
        self._ranked_kv: KVManager | None = None
        self._ranked_version = -1
        self._ranked_ordinals = -1  # ScoreBoard.ordinals_version the ranking read

    def victims(self, kv: KVManager, entry: E, running: Sequence[R], *, need_slot: bool) -> list[R]:
        """Return the running requests to retract so that ``entry`` fits.

        Candidates are requests of workflows younger than ``entry``'s (a request outside
        any workflow ranks youngest) retracted fewer than ``max_retractions`` times,
        taken youngest workflow first, the latest admitted first within one, as
        :func:`fewest_victims` takes them.

        Does not modify the cache.
        """
        age = _age(kv, entry)
        younger = [
            (i, r)
            for i, r in enumerate(running)
            if r.admission is not None
            and r.retractions < self.max_retractions
            and _age(kv, r) > age
        ]
        order = [r for _, r in sorted(younger, key=lambda ir: (-_age(kv, ir[1]), -ir[0]))]
        return fewest_victims(kv, entry, order, need_slot=need_slot)

    def cohort(self, kv: KVManager, waiting: Sequence[E]) -> set[str]:
        """Return the oldest active workflows whose contexts fit in the cache together.

        A workflow's context is estimated by its latest queued prompt; the cohort is
        the longest run of workflows, oldest first, whose estimates sum to at most
        ``cohort_fill`` x (GPU + host capacity); never empty.
        """
        scores = kv.scores
        if kv is not self._kv or scores.workflows_version != self._active_version:
            # ages only change with the set
            active = scores.active_workflows
            self._kv, self._active, self._active_version = kv, active, scores.workflows_version
            self._by_age = sorted(active, key=scores.ordinal)
            self._live = live = set(active)
            self._context_tokens = {w: n for w, n in self._context_tokens.items() if w in live}
        live = self._live
        for entry in waiting:
            wid = entry.request.workflow_id
            if wid is not None and wid in live:
                self._context_tokens[wid] = len(entry.request.prompt_token_ids)
        assert self.cohort_fill is not None
        cfg = kv.config
        budget = self.cohort_fill * (cfg.gpu_capacity_blocks + cfg.host_capacity_blocks)
        budget *= cfg.block_size
        members: set[str] = set()
        used = 0
        for wid in self._by_age:
            used += self._context_tokens.get(wid, 0)
            if members and used > budget:
                break
            members.add(wid)
        return members

    def deferred(
        self, kv: KVManager, waiting: Sequence[E], prefill_share: float | None = None
    ) -> set[int]:
        """Hold back requests of workflows outside the cohort (see :meth:`cohort`) while
        recompute keeps the GPU busy.

        Holding back trades batch parallelism for cached contexts. That pays only while
        prefill (mostly recompute of evicted contexts) is what the GPU spends its time on;
        while decode dominates, running more workflows at once is worth more than their
        contexts. So the cohort engages when ``prefill_share`` reaches
        :attr:`engage_share`, and lets go when it falls below :attr:`release_share` with
        nobody held back: a cohort that holds requests back lowers the prefill share by
        its own success, which is no sign that the load has eased. An engine that does
        not measure the share (``None``) keeps the cohort engaged.
        """
        return set(self._deferred(kv, list(waiting), prefill_share))

    def _deferred(self, kv: KVManager, entries: list[E], prefill_share: float | None) -> set[int]:
        if self.cohort_fill is None:
            return set()
        if prefill_share is not None and not self._engaged:
            self._engaged = prefill_share >= self.engage_share
            if not self._engaged:
                return set()
        # the cohort reads the active workflows and the queue's prompts, nothing else
        if not (
            kv is self._kv
            and kv.scores.workflows_version == self._active_version
            and _same(entries, self._held_for)
        ):
            members = self.cohort(kv, entries)
            self._held_for = entries
            self._held = {
                id(e)
                for e in entries
                if e.request.workflow_id is not None and e.request.workflow_id not in members
            }
        if prefill_share is not None and prefill_share < self.release_share and not self._held:
            self._engaged = False
        return self._held

    def _released(
        self,
        kv: KVManager,
        queue: list[E],
        held: set[int],
        running: int,
        costs: ForwardCosts | None,
    ) -> Collection[int]:
        """Return the held requests whose hold costs more forwards than it saves; they
        are tried as if not held (queue-aware eviction still does not count them).

        Held back, a request cannot evict the cohort's contexts: at most the GPU room it
        would take (its prompt past its GPU-cached prefix, a host hit included, and its
        decode budget, ``n`` tokens) is saved from recompute, ``n · prefill_token_s``.
        But its ``d`` decode tokens then do not ride in the forwards of the ``β``
        requests running (``running``, at least 1): run later in a batch about as large
        as the one running without it, each takes a share ``forward_s / β`` of a forward
        instead of ``forward_s / (β + 1)``, so the hold costs ``d · forward_s / (β (β +
        1))``. A request stays held only while its saving is at least that: where many
        requests run, or a forward costs few prefill tokens' compute, every hold pays;
        where few run and every forward is a full read of the weights against cheap
        tokens, a request with little to take and much to decode is let in. With
        ``costs`` unknown (``None``) every hold stands.

        Does not modify ``held`` or the cache.
        """
        if costs is None:
            return _NONE
        beta = max(1, running)
        per_token_s = costs.forward_s / (beta * (beta + 1))
        if costs.prefill_token_s >= per_token_s:
            return _NONE  # n >= d tokens: every hold pays
        bs = kv.config.block_size
        released = set()
        for entry in queue:
            if id(entry) not in held:
                continue
            request = entry.request
            on_gpu = kv.tree.peek_prefix(entry.keys, request.namespace)[0] * bs
            taken = max(0, len(request.prompt_token_ids) - on_gpu) + request.max_new_tokens
            if taken * costs.prefill_token_s < request.max_new_tokens * per_token_s:
                released.add(id(entry))
        return released if released else _NONE

    def rank(self, kv: KVManager, waiting: Sequence[E]) -> list[E]:
        return list(self._rank(kv, list(waiting)))

    def _rank(self, kv: KVManager, entries: list[E]) -> list[E]:
        index, scores = kv.waiting, kv.scores
        # The ranking reads the queue, its index's cached lengths (current while the
        # index's version stays) and the workflows' ordinals (while their version stays,
        # the ages are the same and reading them again would assign none).
        if (
            kv is self._ranked_kv
            and index.version == self._ranked_version
            and scores.ordinals_version == self._ranked_ordinals
            and _same(entries, self._ranked_for)
        ):
            return self._ranked  # type: ignore[return-value]
        ordinal = scores.ordinal
        ages = [  # as eviction ranks
            NO_WORKFLOW if (wid := e.request.workflow_id) is None else ordinal(wid) for e in entries
        ]
        # cached lengths come from the queue's index when it holds this queue, current
        indexed = index.current and [id(e.keys) for e in entries] == index.order
        if (
            indexed
            and kv is self._ranked_kv
            and index.version == self._ranked_version
            and ages == self._ranked_ages
            and _same(entries, self._ranked_for)
        ):
            self._ranked_ordinals = scores.ordinals_version
            return self._ranked  # type: ignore[return-value]
        bs, bands = kv.config.block_size, self.value_bands
        # the index holds every entry's walk when ``indexed``; else walk the tree
        lookup = index.cached_blocks if indexed else kv.queued_cached_blocks
        keys = []
        for entry, age in zip(entries, ages, strict=True):
            cached = lookup(entry.keys, entry.request.namespace)
            if cached is None:
                cached = kv.queued_cached_blocks(entry.keys, entry.request.namespace)
            share = cached * bs / max(1, len(entry.request.prompt_token_ids))
            keys.append((-min(bands - 1, int(share * bands)), age))
        ranked = [entries[i] for i in sorted(range(len(entries)), key=keys.__getitem__)]
        if indexed:
            self._ranked_kv, self._ranked_version = kv, index.version
            self._ranked, self._ranked_for, self._ranked_ages = ranked, entries, ages
            self._ranked_ordinals = scores.ordinals_version
        else:
            self._ranked_version = -1
        return list(ranked)
