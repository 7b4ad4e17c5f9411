"""The shell shared by owned-cache engines (``sim``, ``torch``): a request queue,
admission through the KV manager in a scheduler's order (§7.0), and the wait for each
request's result (§7)."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import trio

from pbkv.engines.admission import ForwardCosts
from pbkv.engines.base import (
    CallbackFailed,
    EngineError,
    GenerateRequest,
    GenerateResult,
    RequestTooLarge,
)
from pbkv.engines.scheduler import Scheduler, get_scheduler
from pbkv.kvmanager import Admission, KVManager, block_keys
from pbkv.runtime.clock import now_s


@dataclass(eq=False)
class Queued:
    """A request's state as the shell sees it; each engine extends it with its own.

    Args:
        request: what was asked.
        keys: the prompt's block keys.
        submit_s: when it was queued.
        done: set once ``result`` or ``error`` is.
        admission: the KV manager's admission, once admitted.
        admit_s / first_token_s: when it was first admitted, and produced its first
            token (a retraction changes neither).
        streamed: tokens of the current run's output already handed to
            ``request.on_token`` (the carried ones were handed before).
        retractions: times the request was retracted (§7.0).
        origin: the caller's request once ``request`` resumes it (prompt + ``carried``).
        carried: output tokens generated before the last retraction, in order.
        first_admission: the first admission (what the result reports as cached).
        callback_error: what ``request.on_token`` raised (the request ended there).
    """

    request: GenerateRequest
    keys: list[int]
    submit_s: float
    done: trio.Event = field(default_factory=trio.Event)
    admission: Admission | None = None
    admit_s: float = 0.0
    first_token_s: float = 0.0
    result: GenerateResult | None = None
    error: BaseException | None = None
    streamed: int = 0
    retractions: int = 0
    origin: GenerateRequest | None = None
    carried: tuple[int, ...] = ()
    first_admission: Admission | None = None
    callback_error: Exception | None = None

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt being prefilled (a resumption's includes ``carried``)."""
        return len(self.request.prompt_token_ids)

    @property
    def asked(self) -> GenerateRequest:
        """The caller's request."""
        return self.origin if self.origin is not None else self.request


E = TypeVar("E", bound=Queued)

PREFILL_SHARE_TAU_S = 10.0
"""Time constant of :attr:`OwnedCacheEngine.prefill_share`'s moving average, seconds."""


class OwnedCacheEngine(Generic[E]):
    """Queue requests, admit them in the scheduler's order, and hand each caller its result.

    Subclasses implement one scheduler step (:meth:`_step`), name their per-request
    state (``entry_type``, a :class:`Queued`), take an admitted request in
    (:meth:`_start`), and, for a scheduler that retracts, say which running requests
    can be paused now (:meth:`_retractable`) and commit what one computed
    (:meth:`_pause`).

    Args:
        kv: the KV manager whose radix tree is the engine's allocator.
        max_batch_size: most requests running at once.
        scheduler: admission order, a name from
            :data:`pbkv.engines.scheduler.SCHEDULERS` or a :class:`Scheduler`.

    Raises:
        ValueError: unknown scheduler name.
    """

    owns_cache = True
    entry_type: type[E]

    def __init__(
        self, kv: KVManager, max_batch_size: int, scheduler: str | Scheduler = "fcfs"
    ) -> None:
        self.kv = kv
        self.max_batch_size = max_batch_size
        self.scheduler = get_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
        self.has_host_tier = kv.config.host_capacity_blocks > 0
        self._waiting: deque[E] = deque()
        self._running: list[E] = []
        self._wake = trio.Event()
        # True while a step's plan runs outside the trio thread (torch: a worker thread
        # writes into the running requests' blocks); a cancelled request is then taken
        # out only after the step, by _reap_cancelled.
        self._executing = False
        self._cancelled: list[E] = []
        # Share of the GPU's recent time spent on prefill (an EWMA over PREFILL_SHARE_TAU_S);
        # None where the engine does not measure it. The workflow scheduler holds back
        # requests to keep contexts cached only while recompute is what the GPU is busy with.
        self.prefill_share: float | None = None
        self._retractions = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the scheduler loop until cancelled.

        However the loop ends (cancelled, or a step raised), every request still queued
        or running fails with :class:`EngineError` and in-flight loads are abandoned, so
        no lease or block outlives the loop: a supervisor may restart the engine over
        the same KV manager (§10).
        """
        task_status.started()
        try:
            while True:
                await self._step()
        finally:
            self._fail_all(EngineError("engine stopped"))

    def _fail_all(self, error: EngineError) -> None:
        """Fail every queued and running request with ``error``; abandon in-flight loads."""
        for entry in [*self._running, *self._waiting]:
            if not entry.done.is_set():
                self._fail(entry, error)
        self._running.clear()
        self._waiting.clear()
        self._cancelled.clear()
        self._abandon_loads()

    def _abandon_loads(self) -> None:
        """Fail the loads still in flight (``complete_load(ok=False)``)."""
        raise NotImplementedError

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Queue ``request`` and wait for its result.

        Cancelling the caller (a trio cancel scope around this call) takes the request
        out of the engine, queued, prefilling or decoding: its lease and reserved blocks
        are released (at the end of the step in flight, if its blocks are in use), and
        what it already committed stays in the tree under the KV manager's rules (its
        workflow's, retired once that ends).

        Raises:
            ValueError: an invalid request (see :meth:`_validate`).
            RequestTooLarge: the request can never fit in the GPU tier (at once).
            CallbackFailed: ``request.on_token`` raised (this request alone fails).
            EngineError: the engine failed.
        """
        self._validate(request)
        self._check_fits(request)
        bs = self.kv.config.block_size
        keys = block_keys(request.prompt_token_ids, bs, request.namespace)
        entry = self._new_entry(request, keys, now_s())
        self._waiting.append(entry)
        self._wake.set()
        try:
            await entry.done.wait()
        except BaseException:
            if not entry.done.is_set():
                self._cancel(entry)
            raise
        if entry.error is not None:
            raise entry.error
        if entry.callback_error is not None:
            raise CallbackFailed(
                f"request {request.request_id}: on_token raised "
                f"{type(entry.callback_error).__name__}: {entry.callback_error}"
            ) from entry.callback_error
        assert entry.result is not None
        return entry.result

    def _check_fits(self, request: GenerateRequest) -> None:
        """Raise :class:`RequestTooLarge` if ``request`` needs more than the GPU tier."""
        needed = self.kv.blocks_needed(len(request.prompt_token_ids), request.max_new_tokens)
        capacity = self.kv.config.gpu_capacity_blocks
        if needed > capacity:
            raise RequestTooLarge(
                f"request {request.request_id}: request needs {needed} GPU blocks; "
                f"the tier holds {capacity}"
            )

    def _cancel(self, entry: E) -> None:
        """Take the request of a cancelled caller out of the engine (§10).

        Mutates: the queue, the running batch, the KV manager (via :meth:`_fail`).
        """
        error = _cancelled(entry)
        if entry in self._waiting:
            self._waiting.remove(entry)
        elif self._executing:
            self._cancelled.append(entry)  # its blocks are in use until the step ends
            return
        elif entry in self._running:
            self._running.remove(entry)
        self._fail(entry, error)
        self._wake.set()

    def _reap_cancelled(self) -> None:
        """Fail the requests cancelled while a step was executing (call after the step)."""
        cancelled, self._cancelled = self._cancelled, []
        for entry in cancelled:
            if entry.done.is_set():
                continue  # it finished in that very step
            if entry in self._running:
                self._running.remove(entry)
            self._fail(entry, _cancelled(entry))

    async def _wait_for_work(self, deadline_s: float = math.inf) -> None:
        """Sleep until a request arrives or the clock reaches ``deadline_s``."""
        with trio.move_on_at(deadline_s):
            await self._wake.wait()
        self._wake = trio.Event()

    def _validate(self, request: GenerateRequest) -> None:
        """Reject an empty prompt or ``max_new_tokens < 1`` (``ValueError``)."""
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id}: empty prompt")
        if request.max_new_tokens < 1:
            raise ValueError(f"request {request.request_id}: max_new_tokens must be >= 1")

    def _admit(self) -> None:
        # a scheduler that says it never retracts (preempt False) is not handed the
        # running requests it would ignore: listing them walks every load, every step
        may_retract = getattr(self.scheduler, "preempt", True)
        self.scheduler.admit(
            self.kv,
            self._waiting,
            self.max_batch_size - len(self._running),
            on_admit=self._admitted,
            on_reject=self._fail,
            running=len(self._running),
            prefill_share=self.prefill_share,
            costs=self._forward_costs(),
            retractable=self._retractable() if may_retract else (),
            on_retract=self._retract,
        )

    def _admitted(self, entry: E, admission: Admission) -> None:
        if entry.first_admission is None:
            entry.first_admission = admission
            entry.admit_s = now_s()
        self._start(entry, admission)

    def _forward_costs(self) -> ForwardCosts | None:
        """Return what the engine's forwards cost now, for the scheduler (unknown here)."""
        return None

    def _retractable(self) -> list[E]:
        """Return the running requests that may be retracted now (none by default)."""
        return []

    def _retract(self, entry: E) -> None:
        """Pause a running request and queue it again to resume where it stopped (§7.0).

        What it computed is committed to the tree (by :meth:`_pause`), its lease and
        unused reservation are released, and it rejoins the queue as a resumption:
        prompt = its prompt plus every token generated so far, decode budget = what is
        left. Tokens already streamed are not streamed again.

        Mutates: the running batch, the queue, the KV manager.
        """
        admission = entry.admission
        assert admission is not None and not entry.done.is_set()
        output = self._pause(entry)
        self.kv.release(admission, requeued=True)
        self._running.remove(entry)
        self._retractions += 1
        entry.retractions += 1
        entry.streamed = 0
        if output:
            asked = entry.asked
            entry.carried += tuple(output)
            entry.origin = asked
            entry.request = resumption(asked, entry.carried)
            bs = self.kv.config.block_size
            entry.keys = block_keys(
                entry.request.prompt_token_ids, bs, asked.namespace, known=entry.keys
            )
        self._waiting.append(entry)

    def _pause(self, entry: E) -> list[int]:
        """Commit what ``entry`` computed; reset its run state; return its new output.

        Mutates: the KV manager (commit only; the shell releases).
        """
        raise NotImplementedError

    def _result(
        self, entry: E, output: Sequence[int], now: float, hidden: np.ndarray | None = None
    ) -> GenerateResult:
        """Return ``entry``'s result: ``carried`` + ``output``, cache figures of its first
        admission, times from its submission."""
        first = entry.first_admission
        assert first is not None
        return GenerateResult(
            request_id=entry.asked.request_id,
            output_token_ids=entry.carried + tuple(output),
            prompt_tokens=len(entry.asked.prompt_token_ids),
            cached_gpu_tokens=first.cached_gpu_tokens,
            cached_host_tokens=first.cached_host_tokens,
            computed_tokens=first.computed_tokens,
            queue_s=entry.admit_s - entry.submit_s,
            ttft_s=entry.first_token_s - entry.submit_s,
            e2e_s=now - entry.submit_s,
            hidden=hidden,
        )

    def _note_busy(self, step_s: float, prefill_s: float) -> None:
        """Fold a step of ``step_s`` seconds, ``prefill_s`` of them prefill, into
        :attr:`prefill_share`."""
        if step_s <= 0:
            return
        share = min(1.0, max(0.0, prefill_s / step_s))
        weight = 1.0 - math.exp(-step_s / PREFILL_SHARE_TAU_S)
        current = self.prefill_share or 0.0
        self.prefill_share = current + weight * (share - current)

    def _note_idle(self, idle_s: float) -> None:
        """Fold ``idle_s`` seconds without work (prefill share 0) into :attr:`prefill_share`."""
        if self.prefill_share is not None and idle_s > 0:
            self.prefill_share *= math.exp(-idle_s / PREFILL_SHARE_TAU_S)

    def _stream(self, entry: E, output: tuple[int, ...] | list[int]) -> bool:
        """Hand ``request.on_token`` the tokens of ``output`` it has not seen yet.

        Called in the event loop (never from a worker thread) after each step.

        Returns:
            whether the callback asked to end the request, or raised (kept in
            ``entry.callback_error``: the request alone fails, not the step); then
            ``entry.streamed`` is the number of tokens of ``output`` to keep (the one it
            ended on included) and the later ones are not handed over.
        """
        callback = entry.request.on_token
        if callback is None:
            return False
        for token in output[entry.streamed :]:
            entry.streamed += 1
            try:
                if callback(token):
                    return True
            except Exception as error:
                entry.callback_error = error
                return True
        return False

    def _fail(self, entry: E, error: BaseException) -> None:
        """End ``entry`` with ``error``, releasing its hold on the cache (§10)."""
        admission = entry.admission
        if admission is not None:
            self.kv.release(admission)
        entry.error = error
        entry.done.set()

    async def _step(self) -> None:
        raise NotImplementedError

    def _new_entry(self, request: GenerateRequest, keys: list[int], submit_s: float) -> E:
        return self.entry_type(request, keys, submit_s)

    def _start(self, entry: E, admission: Admission) -> None:
        raise NotImplementedError


def resumption(request: GenerateRequest, carried: tuple[int, ...]) -> GenerateRequest:
    """Return the request that resumes ``request`` after it generated ``carried``.

    Its prompt is ``request``'s plus ``carried`` (one more segment), its decode budget
    what is left, its scripted output the rest; ``carried`` must be shorter than
    ``max_new_tokens``.
    """
    n = len(carried)
    assert 0 < n < request.max_new_tokens
    segments = request.segment_lengths
    return dataclasses.replace(
        request,
        prompt_token_ids=request.prompt_token_ids + carried,
        max_new_tokens=request.max_new_tokens - n,
        segment_lengths=(*segments, n) if segments else (),
        scripted_output_token_ids=request.scripted_output_token_ids[n:],
    )


def _cancelled(entry: Queued) -> EngineError:
    return EngineError(f"request {entry.asked.request_id}: cancelled by its caller")
