"""Steering TensorRT-LLM's block manager with PBKV scores (§7.3; reference notes §9).

Plain synchronous code. TensorRT-LLM 1.2 evicts by strict priority, then LRU; a GPU
victim at priority ≥ 30 is offloaded to host, below 30 dropped with its subtree; the
latest claim on a block sets its priority; the last prompt token is never reused. So
pbkv maps its lifecycle state to **coarse bands**:

- shared prefix (preamble + role prompt, and blocks used by several live workflows):
  ``shared`` (95, no expiry);
- retired cache and dead private cache (score ≈ 0): ``dead`` (10): dropped, not offloaded;
- active cache: bands from 40 by ``Score(c)`` (default two: 40, and 50 for a score of
  2 or more), lapsing to 35 (the default) after the predicted time to next use ×
  ``duration_slack`` (durations restart at each release);
- decode blocks: an active band when the workflow is predicted to go on (its output
  is the next prompt's prefix), ``dead`` when it is predicted to end.

Re-tagging and prefetch go through 1-token *touch* requests on a prefix: the touch
claims every block of the path with an explicit priority (and onboards host blocks).
:class:`MirrorKV` is the KV manager of this mode: the lifecycle calls of
:class:`pbkv.kvmanager.KVManager` over the mirror's blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pbkv.engines.trtllm.api import OFFLOAD_MIN_PRIORITY, Api, to_timedelta
from pbkv.engines.trtllm.mirror import GPU, HOST, Mirror, MirrorBlock
from pbkv.kvmanager import ScoreBoard, agent_weights, get_policy
from pbkv.kvmanager.policies import Policy


@dataclass(frozen=True, slots=True)
class Bands:
    """Priority bands (0..100) and the score thresholds that pick them.

    Coarse on purpose (measured on hover under pressure, ``pbkv bench --engine
    trtllm-sim``): six score bands 40..90 lost 7% latency to two. Strict priority beats
    recency, and an offloaded block keeps its priority but loses its duration, so
    stale high bands clog the host tier.

    Args:
        shared / dead: priorities of shared preambles and of retired or dead cache
            (``dead`` must stay below the offload threshold 30).
        active_low / active_high / band_width: active cache uses
            ``active_low + band_width * j`` up to ``active_high``.
        score_per_band: score step between two active bands.
        dead_score: private cache scored below this is dead.
        duration_slack: active priorities last this many predicted next-use times.
    """

    shared: int = 95
    dead: int = 10
    active_low: int = 40
    active_high: int = 50
    band_width: int = 10
    score_per_band: float = 2.0
    dead_score: float = 0.01
    duration_slack: float = 4.0

    def __post_init__(self) -> None:
        if not 0 <= self.dead < OFFLOAD_MIN_PRIORITY <= self.active_low <= self.active_high <= 100:
            raise ValueError(f"bands must satisfy dead < 30 <= active_low <= active_high: {self}")

    def priority(self, score: float, *, retired: bool, shared: bool) -> int:
        """Return the band of one block."""
        if shared:
            return self.shared
        if retired or score < self.dead_score:
            return self.dead
        step = int(score // self.score_per_band)
        return min(self.active_high, self.active_low + self.band_width * step)


def token_ranges(
    priorities: Sequence[tuple[int, float | None]], tokens_per_block: int, api: Api
) -> list[object]:
    """Merge per-block ``(priority, duration_s)`` into sorted, non-overlapping token
    ranges of ``api``'s ``TokenRangeRetentionConfig``; the last range is open-ended."""
    ranges = []
    start = 0
    for i in range(1, len(priorities) + 1):
        if i < len(priorities) and priorities[i] == priorities[start]:
            continue
        prio, duration_s = priorities[start]
        end = None if i == len(priorities) else i * tokens_per_block
        cls = api.KvCacheRetentionConfig.TokenRangeRetentionConfig
        ranges.append(cls(start * tokens_per_block, end, prio, to_timedelta(duration_s)))
        start = i
    return ranges


def retention_config(
    priorities: Sequence[tuple[int, float | None]],
    tokens_per_block: int,
    decode_priority: int,
    api: Api,
    decode_duration_s: float | None = None,
) -> object:
    """Build one request's ``KvCacheRetentionConfig`` from per-block priorities."""
    return api.KvCacheRetentionConfig(
        token_ranges(priorities, tokens_per_block, api),
        decode_retention_priority=decode_priority,
        decode_duration_ms=to_timedelta(decode_duration_s),
    )


@dataclass(frozen=True, slots=True)
class Touch:
    """A 1-token touch request: re-tag (and onboard) every block of a prefix.

    Attributes:
        kind: ``demote`` (retired cache below 30) or ``prefetch`` (onboard a host prefix
            a predicted next agent will read).
        blocks: the path, root first.
        prompt_token_ids: the path's tokens plus one (the last prompt token is never
            reused, so one extra token makes every path block matchable).
        salt: the cache salt of the path.
        priorities: per-block ``(priority, duration_s)``.
    """

    kind: str
    blocks: tuple[MirrorBlock, ...]
    prompt_token_ids: tuple[int, ...]
    salt: str
    priorities: tuple[tuple[int, float | None], ...]


class MirrorKV:
    """The KV manager of the engine-owned mode: lifecycle state on the mirror's blocks.

    Offers the lifecycle calls the KV-manager actor makes on a
    :class:`pbkv.kvmanager.KVManager` (``on_workflow_started``, ``on_forecast``,
    ``on_agent_invoked``, ``on_workflow_terminated``, ``policy``), and the steering
    decisions the adapter asks for.

    Args:
        policy: ``pbkv`` (forecasts, steering) or ``lru`` (TensorRT-LLM's default:
            no forecasts; the adapter then sends no retention configs).
        tokens_per_block: the engine's page size.
        horizon / gamma: score horizon ``K`` and decay (paper Eq. 2).
        bands: the priority bands.
        resync_events: the mirror's resync window after an event gap.
        max_expected_blocks: announced blocks waiting for their ``stored`` event, at
            most (the oldest are forgotten: blocks of failed or never-stored requests).
    """

    def __init__(
        self,
        policy: str = "pbkv",
        *,
        tokens_per_block: int = 32,
        horizon: int = 3,
        gamma: float = 0.8,
        bands: Bands | None = None,
        resync_events: int = 1024,
        max_expected_blocks: int = 1 << 16,
    ) -> None:
        self.policy: Policy = get_policy(policy)
        self.tokens_per_block = tokens_per_block
        self.horizon = horizon
        self.bands = bands or Bands()
        self.scores = ScoreBoard(self._reprioritize, gamma)
        self.mirror = Mirror(resync_events, self._on_remove, tokens_per_block)
        self._retired: dict[MirrorBlock, None] = {}  # demotion candidates (ordered)
        self._deepest: dict[tuple[str, str], MirrorBlock] = {}  # (workflow, agent) -> block
        self._forecasts: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {}
        self._expected: dict[int, list[tuple[str, str, str]]] = {}  # oldest first
        self.max_expected_blocks = max_expected_blocks
        self.step_s = 0.0  # running mean of an invocation's latency (next-use time unit)
        self._steps_seen = 0
        self.changed = 0  # bumps on every state change
        self.listener: Callable[[], None] | None = None  # the adapter's touch-loop wake-up
        self._forecast_serial: dict[str, int] = {}
        self._prefetched: dict[str, int] = {}

    @property
    def steering(self) -> bool:
        return self.policy.uses_forecasts

    def _reprioritize(self, block: MirrorBlock) -> None:
        self.changed += 1
        if block.retired:
            self._retired[block] = None
        else:
            self._retired.pop(block, None)

    def _on_remove(self, block: MirrorBlock) -> None:
        self.scores.on_remove(block)
        self._retired.pop(block, None)

    def _notify(self) -> None:
        self.changed += 1
        if self.listener is not None:
            self.listener()

    # -- lifecycle (the KV-manager actor) ---------------------------------------------

    def on_workflow_started(self, workflow_id: str) -> None:
        self.scores.start(workflow_id)

    def on_agent_invoked(self, workflow_id: str, agent: str, step: int) -> None:
        """Baseline trackers only; nothing to do here."""

    def on_forecast(self, workflow_id: str, forecast: np.ndarray, agents: Sequence[str]) -> int:
        """Refresh ``workflow_id``'s blocks from a ``(K, |V|+1)`` forecast; return how many."""
        if not self.steering:
            return 0
        forecast = forecast[: self.horizon]
        self._forecasts[workflow_id] = (forecast, tuple(agents))
        self._forecast_serial[workflow_id] = self._forecast_serial.get(workflow_id, 0) + 1
        refreshed = self.scores.set_forecast(workflow_id, forecast, agents)
        self._notify()
        return refreshed

    def on_workflow_terminated(self, workflow_id: str) -> None:
        """Retire the workflow: its private blocks become retired (and get demoted)."""
        self.scores.terminate(workflow_id)
        self._forecasts.pop(workflow_id, None)
        self._forecast_serial.pop(workflow_id, None)
        self._prefetched.pop(workflow_id, None)
        for key in [k for k in self._deepest if k[0] == workflow_id]:
            del self._deepest[key]
        self._notify()

    # -- per request (the adapter) -----------------------------------------------------

    def note_request(
        self, hashes: Sequence[int], workflow_id: str | None, agent: str, salt: str
    ) -> list[MirrorBlock]:
        """Record that ``agent`` of ``workflow_id`` reads the prompt with ``hashes``.

        Blocks already mirrored get the accessor now; the rest when their ``stored``
        event arrives (:meth:`on_stored`). Returns the mirrored prefix.

        Mutates: accessors, scores, salts.
        """
        blocks = self.mirror.match(hashes)
        for b in blocks:
            b.salt = salt
        if workflow_id is not None:
            self.scores.touch(blocks, workflow_id, agent)
            if blocks:
                self._note_deepest(workflow_id, agent, blocks[-1])
            for h in hashes[len(blocks) :]:
                self._expected.setdefault(h, []).append((workflow_id, agent, salt))
            while len(self._expected) > self.max_expected_blocks:  # never stored: forget
                del self._expected[next(iter(self._expected))]
        return blocks

    def on_stored(self) -> None:
        """Give newly mirrored blocks the accessors their requests announced."""
        for h in self.mirror.drain_new():
            block = self.mirror.blocks.get(h)
            if block is None or h not in self._expected:
                continue
            for workflow_id, agent, salt in self._expected.pop(h):
                block.salt = salt
                self.scores.touch([block], workflow_id, agent)
                self._note_deepest(workflow_id, agent, block)

    def _note_deepest(self, workflow_id: str, agent: str, block: MirrorBlock) -> None:
        key = (workflow_id, agent)
        known = self._deepest.get(key)
        if known is None or known.hash not in self.mirror.blocks or block.depth >= known.depth:
            self._deepest[key] = block

    def note_latency(self, e2e_s: float) -> None:
        """Fold one invocation's latency into the running mean (the next-use time unit)."""
        self._steps_seen += 1
        self.step_s += (e2e_s - self.step_s) / self._steps_seen

    def block_priorities(
        self,
        hashes: Sequence[int],
        mirrored: Sequence[MirrorBlock],
        prompt_blocks: int,
        workflow_id: str | None,
        agent: str,
        shared_tokens: int,
    ) -> list[tuple[int, float | None]]:
        """Return ``(priority, duration_s)`` for each of the prompt's ``prompt_blocks``.

        A block inside the first ``shared_tokens`` (the shared preamble) is shared; a
        mirrored block is banded by its own score; a new block by this agent's weight.
        """
        weight = self._weight(workflow_id, agent)
        duration = self._duration_s(workflow_id, agent)
        out = []
        for i in range(prompt_blocks):
            shared = (i + 1) * self.tokens_per_block <= shared_tokens
            if i < len(mirrored):
                b = mirrored[i]
                shared = shared or len(b.accessors) > 1
                prio = self.bands.priority(b.score, retired=b.retired, shared=shared)
            else:
                prio = self.bands.priority(weight, retired=False, shared=shared)
            out.append((prio, None if shared or prio == self.bands.dead else duration))
        return out

    def decode_priority(self, workflow_id: str | None, agent: str) -> tuple[int, float | None]:
        """Band of the decode blocks: active if the output feeds a later prompt (the
        workflow is predicted to go on), dead if it is predicted to end."""
        if workflow_id is None or workflow_id not in self._forecasts:
            return self.bands.active_low, None
        forecast, _ = self._forecasts[workflow_id]
        if forecast[0, -1] >= 0.5:
            return self.bands.dead, None
        prio = self.bands.priority(self._weight(workflow_id, agent), retired=False, shared=False)
        return max(prio, self.bands.active_low), self._duration_s(workflow_id, agent)

    def _weight(self, workflow_id: str | None, agent: str) -> float:
        if workflow_id is None or workflow_id not in self._forecasts:
            return self.bands.score_per_band  # no forecast yet: the lowest active band
        forecast, agents = self._forecasts[workflow_id]
        u, _ = agent_weights(forecast, agents, self.scores.gamma)
        return u.get(agent, 0.0)

    def _duration_s(self, workflow_id: str | None, agent: str) -> float | None:
        """Predicted time to ``agent``'s next use × slack: expected steps × mean step."""
        if workflow_id is None or workflow_id not in self._forecasts or self.step_s <= 0:
            return None
        forecast, agents = self._forecasts[workflow_id]
        if agent not in agents:
            return None
        alive = np.concatenate(([1.0], np.cumprod(1.0 - forecast[:-1, -1])))
        p = alive * forecast[:, agents.index(agent)]
        if p.sum() <= 1e-9:
            return None
        steps = float((np.arange(1, len(p) + 1) * p).sum() / p.sum())
        return self.bands.duration_slack * steps * self.step_s

    # -- touches --------------------------------------------------------------------

    def plan_demotions(self, limit: int) -> list[Touch]:
        """Touches that drop retired GPU cache below 30, deepest retired block first.

        Only GPU-resident paths (a touch on host blocks would onboard them).
        """
        candidates = [
            b
            for b in self._retired
            if b.retired
            and b.level == GPU
            and OFFLOAD_MIN_PRIORITY <= b.priority < self.bands.shared
            and not b.pending_touch
            and not any(c.retired and c.level == GPU for c in b.children.values())
        ]
        touches = []
        for leaf in candidates:
            touch = self._touch("demote", leaf.path())
            if touch is not None:
                touches.append(touch)
            if len(touches) >= limit:
                break
        return touches

    def plan_prefetch(
        self, limit: int, gpu_room_blocks: int, min_next_p: float = 0.3
    ) -> list[Touch]:
        """Touches that onboard the host part of a prefix a predicted next agent reads.

        For each live workflow, its most likely next agent (``P^(1) >= min_next_p``) and
        that agent's deepest mirrored block; only paths whose host blocks fit in
        ``gpu_room_blocks`` (free GPU space plus dead cache, conservative §5.4). At most
        one prefetch per workflow per forecast.
        """
        touches: list[Touch] = []
        for workflow_id, (forecast, agents) in self._forecasts.items():
            if len(touches) >= limit:
                break
            serial = self._forecast_serial.get(workflow_id, 0)
            if self._prefetched.get(workflow_id) == serial:
                continue
            nxt = int(np.argmax(forecast[0, :-1]))
            if forecast[0, nxt] < min_next_p:
                continue
            deepest = self._deepest.get((workflow_id, agents[nxt]))
            if deepest is None or deepest.hash not in self.mirror.blocks:
                continue
            path = deepest.path()
            on_host = sum(b.level == HOST for b in path)
            if on_host == 0 or on_host + 2 > gpu_room_blocks or any(b.pending_touch for b in path):
                continue
            touch = self._touch("prefetch", path)
            if touch is not None:
                touches.append(touch)
                self._prefetched[workflow_id] = serial
                gpu_room_blocks -= on_host + 2
        return touches

    def _touch(self, kind: str, path: list[MirrorBlock]) -> Touch | None:
        if any(b.tokens is None or b.salt is None for b in path) or not path:
            return None
        salt = path[0].salt
        if any(b.salt != salt for b in path):
            return None
        tokens = tuple(t for b in path for t in b.tokens)  # type: ignore[union-attr]
        prios = []
        for b in path:
            shared = len(b.accessors) > 1 or b.priority >= self.bands.shared
            prio = self.bands.priority(b.score, retired=b.retired, shared=shared)
            prios.append((prio, None))
        prios.append((self.bands.dead, None))  # the tail block holding the extra token
        return Touch(kind, tuple(path), (*tokens, tokens[-1]), salt or "", tuple(prios))


def blocks_of(prompt_tokens: int, tokens_per_block: int) -> int:
    """Blocks a prompt of ``prompt_tokens`` occupies (the last one possibly partial)."""
    return math.ceil(prompt_tokens / tokens_per_block)
