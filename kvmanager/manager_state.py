"""What the KV manager's parts share: the request records, the counters, the state.

:class:`~pbkv.kvmanager.manager.KVManager` is assembled from mixins over
:class:`ManagerState`: :mod:`~pbkv.kvmanager.manager_queries` (what a scheduler asks
before admitting), :mod:`~pbkv.kvmanager.manager_admission` (admit, commit, release) and
:mod:`~pbkv.kvmanager.manager_lifecycle` (workflow events). ``ManagerState`` only
declares the attributes they read; ``KVManager.__init__`` sets them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pbkv.kvmanager.bounds import LoggedInsert
from pbkv.kvmanager.radix import Lease, LoadTransfer, RadixTree

if TYPE_CHECKING:
    from pbkv.kvmanager.belady import BeladyTracker
    from pbkv.kvmanager.bounds import AccessLog
    from pbkv.kvmanager.continuum import ContinuumTracker
    from pbkv.kvmanager.kvflow import KVFlowTracker
    from pbkv.kvmanager.manager import KVConfig
    from pbkv.kvmanager.policies import Policy
    from pbkv.kvmanager.scoring import ScoreBoard
    from pbkv.kvmanager.survival import SurvivalTracker
    from pbkv.kvmanager.timing import TimeWeights
    from pbkv.kvmanager.waiting import WaitingPrefixes


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """What admission needs to know of one request.

    Args:
        keys: block keys of the prompt's full blocks.
        prompt_tokens: prompt length in tokens.
        max_new_tokens: decode budget reserved at admission (so decode never runs out).
        workflow_id / agent: who asks (``None`` for requests outside any workflow).
        namespace: tenant / cache salt.
        fixed_prefix_tokens: leading prompt tokens that are the agent's fixed prefix
            (shared preamble + role prompt), for KVFlow.
        resumed: the re-admission of a retracted request (prompt = its prompt plus the
            tokens it had generated): counted apart from requests, and not an access in
            the offline bounds' log (it re-reads what the request itself computed).
    """

    keys: list[int]
    prompt_tokens: int
    max_new_tokens: int
    workflow_id: str | None = None
    agent: str = ""
    namespace: str = ""
    fixed_prefix_tokens: int = 0
    resumed: bool = False


@dataclass(eq=False, slots=True)
class Admission:
    """A running request's hold on the cache.

    Attributes:
        request: the admitted request.
        lease: lock on its cached prefix (moves down as the prefix grows).
        matched_blocks: blocks of the prompt found cached (GPU + host).
        cached_gpu_tokens / cached_host_tokens: prompt tokens found in each tier.
        loads: host-to-GPU copies the request must wait for (own and joined).
        private_blocks: GPU blocks reserved for the uncached prompt and the output.
        committed_blocks: prompt blocks inserted into the tree so far.
        logged: the access log's record of the latest commit (with a log).
    """

    request: AdmitRequest
    lease: Lease
    matched_blocks: int
    cached_gpu_tokens: int
    cached_host_tokens: int
    loads: list[LoadTransfer]
    private_blocks: list[int]
    committed_blocks: int = 0
    done: bool = False
    logged: LoggedInsert | None = None

    @property
    def computed_tokens(self) -> int:
        return self.request.prompt_tokens - self.cached_gpu_tokens - self.cached_host_tokens


@dataclass(slots=True)
class ManagerCounters:
    """Cumulative counts of what the manager did (read by ``KVManager.statistics``)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_gpu_tokens: int = 0
    cached_host_tokens: int = 0
    prefetch_issued_blocks: int = 0
    prefetch_used_blocks: int = 0
    rejected_admissions: int = 0
    rejected_forecasts: int = 0
    resumed_admissions: int = 0
    resumed_computed_tokens: int = 0


class ManagerState:
    """The attributes of a :class:`~pbkv.kvmanager.manager.KVManager` its mixins read
    (declarations only; see ``KVManager`` for what each holds)."""

    config: KVConfig
    access_log: AccessLog | None
    policy: Policy
    tree: RadixTree
    scores: ScoreBoard
    timing: TimeWeights | None
    waiting: WaitingPrefixes
    kvflow: KVFlowTracker | None
    belady: BeladyTracker | None
    continuum: ContinuumTracker | None
    survival: SurvivalTracker | None
    _counters: ManagerCounters
    _computing: dict[int, int]
    """Prompt block keys running requests are computing (admitted, not yet committed),
    with the number of requests computing each."""
