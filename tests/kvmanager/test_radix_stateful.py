"""Stateful property test of the KV manager: random admissions, loads, commits, releases,
invocations, forecasts, prefetches and evictions keep every §5.1 invariant
(``check_integrity()``), and every node's score is the one a reference model of the
score computes: Eq. 2 plus the per-workflow tail past the horizon and the history blend
(:func:`~pbkv.kvmanager.scoring.agent_weights`), from the call shares, miss rate and
history evidence that ``on_agent_invoked`` keeps."""

import math
import os
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pbkv.kvmanager import (
    HOST_TIERS,
    Admission,
    AdmitRequest,
    KVConfig,
    KVManager,
    LoadTransfer,
    block_keys,
)
from pbkv.kvmanager.scoring import (
    CALL_SHARE_DECAY,
    EVIDENCE_CAP,
    MISS_RATE_DECAY,
    PRIOR_EVIDENCE,
)
from pbkv.kvmanager.weights import HISTORY_SMOOTHING, TAIL_MAX_STEPS

from .conftest import FakeClock, make_manager
from .test_eviction import AGENTS as AGENTS_EVICTION
from .test_eviction import forecast, run

AGENTS = ("a", "b", "c")
WORKFLOWS = ("w0", "w1", "w2")
ALPHABET = st.integers(min_value=0, max_value=1)  # few symbols: prefixes collide often
MAX_PROMPT = 6
PROMPTS = st.lists(ALPHABET, min_size=1, max_size=MAX_PROMPT)
OUTPUTS = st.lists(ALPHABET, min_size=1, max_size=3)
WORKFLOW = st.sampled_from((*WORKFLOWS, None))
AGENT = st.sampled_from(AGENTS)
REUSE = st.one_of(st.none(), st.integers(0, 100))


class ScoreModel:
    """What the score of a node should be, recomputed from the formulas (reference model).

    Mirrors :class:`~pbkv.kvmanager.scoring.ScoreBoard`'s documented rules without its
    incremental bookkeeping: per active workflow its call shares (a moving average of
    one-hot calls), its last forecast's step-1 row and weights ``u``; per board the miss
    rate and the history evidence (:meth:`ScoreBoard.note_invocation`). Where a threshold
    decides (the evidence against the prior), the same float operations are used.
    """

    def __init__(self, gamma: float, beyond_horizon: bool) -> None:
        self.gamma = gamma
        self.beyond_horizon = beyond_horizon
        self.miss_rate = 1.0
        self.board_evidence = PRIOR_EVIDENCE
        self.evidence: dict[str, float] = {}
        self.shares: dict[str, dict[str, float]] = {}
        self.first: dict[str, list[float]] = {}  # step-1 agent probabilities, AGENTS' order
        self.weights: dict[str, dict[str, float]] = {}
        self.ended: set[str] = set()

    def start(self, w: str) -> None:
        self.ended.discard(w)

    def terminate(self, w: str) -> None:
        for state in (self.evidence, self.shares, self.first, self.weights):
            state.pop(w, None)
        self.ended.add(w)

    def invoke(self, w: str, agent: str) -> None:
        """``on_agent_invoked``: check the step-1 forecast, then count the call."""
        if w in self.ended:
            return
        shares = self.shares.get(w)
        first = self.first.get(w)
        if first is not None:
            p = first[AGENTS.index(agent)]
            self.miss_rate += MISS_RATE_DECAY * ((1.0 - min(1.0, max(0.0, p))) - self.miss_rate)
            if shares and self.beyond_horizon:
                q = _sharpened(first, shares)[AGENTS.index(agent)]
                ratio = _clipped_log_ratio(q, p)
                own = self.evidence.get(w, self.board_evidence)
                self.evidence[w] = _with_evidence(own, ratio)
                self.board_evidence = _with_evidence(self.board_evidence, ratio)
        if shares is None:
            self.shares[w] = {agent: 1.0}
            return
        for name in shares:
            shares[name] *= 1.0 - CALL_SHARE_DECAY
        shares[agent] = shares.get(agent, 0.0) + CALL_SHARE_DECAY

    def history_weight(self, w: str) -> float:
        evidence = self.evidence.get(w, self.board_evidence)
        return 0.0 if evidence < PRIOR_EVIDENCE else 1.0 / (1.0 + math.exp(-evidence))

    def forecast(self, w: str, rows: np.ndarray) -> None:
        """A forecast applied: ``u[a]`` of Eq. 2 over the blended rows, plus the tail."""
        shares = self.shares.get(w) if self.beyond_horizon else None
        mix = self.history_weight(w) if shares else 0.0
        u = dict.fromkeys(AGENTS, 0.0)
        alive = 1.0
        for k, row in enumerate(rows.tolist()):
            agents_row = row[: len(AGENTS)]
            blended = agents_row
            if mix:
                sharp = _sharpened(agents_row, shares)
                blended = [(1 - mix) * p + mix * q for p, q in zip(agents_row, sharp, strict=True)]
            for a, p in zip(AGENTS, blended, strict=True):
                u[a] += self.gamma**k * alive * p
            alive *= 1.0 - row[-1]
        if shares:
            ratio = 1.0 - self.gamma * (1.0 - rows[-1][-1])
            steps = TAIL_MAX_STEPS if ratio * TAIL_MAX_STEPS <= 1.0 else 1.0 / ratio
            tail = self.miss_rate * self.gamma ** len(rows) * alive * steps
            for a, share in shares.items():
                u[a] += tail * share
        self.weights[w] = u
        self.first[w] = rows[0].tolist()[: len(AGENTS)]

    def score(self, node) -> float:
        """``Score(c) = sum_{w in W_act(c)} sum_{a in A_w(c)} u_w[a]``."""
        return sum(
            self.weights[w][a]
            for w, agents in node.accessors.items()
            if w in self.weights
            for a in agents
        )


def _sharpened(row: list[float], shares: dict[str, float]) -> list[float]:
    """``Q[a] = (1 - e) P[a] (h[a] + eps) / sum_b P[b] (h[b] + eps)`` (as is if no mass)."""
    scaled = [
        p * (shares.get(a, 0.0) + HISTORY_SMOOTHING) for a, p in zip(AGENTS, row, strict=True)
    ]
    total = sum(scaled)
    if total <= 0.0:
        return list(row)
    return [x * sum(row) / total for x in scaled]


def _clipped_log_ratio(q: float, p: float) -> float:
    if q <= 0.0 and p <= 0.0:
        return 0.0
    if q <= 0.0 or p <= 0.0:
        return EVIDENCE_CAP if p <= 0.0 else -EVIDENCE_CAP
    return min(EVIDENCE_CAP, max(-EVIDENCE_CAP, math.log(q / p)))


def _with_evidence(evidence: float, ratio: float) -> float:
    return PRIOR_EVIDENCE + (1.0 - MISS_RATE_DECAY) * (evidence - PRIOR_EVIDENCE) + ratio


@dataclass(eq=False)
class Live:
    """One admitted request the machine still holds."""

    admission: Admission
    prompt: list[int]
    output: list[int]
    stage: int = 0  # 0 admitted, 1 prompt committed, 2 prompt + output committed
    loads: list[LoadTransfer] = field(default_factory=list)


class KVManagerMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(["lru", "lae", "he", "pbkv", "pbkv-timed"]),
        block_size=st.integers(1, 2),
        gpu=st.integers(6, 16),
        host=st.sampled_from([0, 2, 3, 4, 8]),
        # gamma 1 with a small END probability reaches the tail's TAIL_MAX_STEPS cap
        gamma=st.sampled_from([0.8, 0.8, 1.0]),
        beyond_horizon=st.sampled_from([True, True, False]),
        host_tier=st.sampled_from(HOST_TIERS),
    )
    def setup(self, policy, block_size, gpu, host, gamma, beyond_horizon, host_tier):
        self.clock = FakeClock()
        cfg = KVConfig(
            block_size=block_size,
            gpu_capacity_blocks=gpu,
            host_capacity_blocks=host,
            bytes_per_block=100,
            policy=policy,
            gamma=gamma,
            bandwidth_bytes_per_s=1000.0,
            beyond_horizon=beyond_horizon,
            host_tier=host_tier,
        )
        self.kv = KVManager(cfg, self.clock)
        self.live: list[Live] = []
        self.pending: list[LoadTransfer] = []  # in issue order
        self.load_ok: dict[LoadTransfer, bool] = {}  # outcome, once completed
        self.active: set[str] = set()
        self.model = ScoreModel(gamma, beyond_horizon)
        self.steps: dict[str, int] = {}  # each workflow's next step
        self.history: list[list[int]] = []  # sequences admitted so far, to ask for again

    # -- helpers ----------------------------------------------------------------------

    def _keys(self, tokens):
        return block_keys(tokens, self.kv.config.block_size)

    def _track(self, loads):
        for load in loads:
            if all(load is not p for p in self.pending) and load not in self.load_ok:
                self.pending.append(load)

    def _ready(self, live):
        return all(self.load_ok.get(load) is True for load in live.loads)

    # -- rules ------------------------------------------------------------------------

    def _admit(self, prompt, output, workflow, agent, reuse):
        if reuse is not None and self.history:  # a cached sequence, extended: hits, reloads
            prompt = (self.history[reuse % len(self.history)] + prompt)[:MAX_PROMPT]
        self.history.append(prompt + output)
        if workflow is not None and workflow not in self.active:
            self.start_workflow(workflow)  # the actor sends WorkflowStarted first
        self.clock.advance()
        keys = self._keys(prompt)
        req = AdmitRequest(keys, len(prompt), len(output), workflow, agent if workflow else "")
        needed = self.kv.blocks_needed(len(prompt), len(output))
        if needed > self.kv.config.gpu_capacity_blocks:
            try:
                self.kv.try_admit(req)
            except ValueError:
                return None
            raise AssertionError("an oversized request was admitted")
        adm = self.kv.try_admit(req)
        if adm is None:
            return None
        assert adm.cached_gpu_tokens + adm.cached_host_tokens <= len(prompt)
        assert adm.cached_gpu_tokens % self.kv.config.block_size == 0
        assert adm.computed_tokens >= 0
        assert len(adm.private_blocks) == needed - adm.matched_blocks
        self._track(adm.loads)
        live = Live(adm, prompt, output, loads=list(adm.loads))
        self.live.append(live)
        return live

    @precondition(lambda self: len(self.live) < 3)
    @rule(prompt=PROMPTS, output=OUTPUTS, workflow=WORKFLOW, agent=AGENT, reuse=REUSE)
    def admit(self, prompt, output, workflow, agent, reuse):
        self._admit(prompt, output, workflow, agent, reuse)

    @rule(prompt=PROMPTS, output=OUTPUTS, workflow=WORKFLOW, agent=AGENT, reuse=REUSE)
    def serve(self, prompt, output, workflow, agent, reuse):
        """A whole request as an engine runs it: admit, load, commit twice, release."""
        live = self._admit(prompt, output, workflow, agent, reuse)
        if live is None:
            return
        waiting = [load for load in live.loads if load not in self.load_ok]
        while ready := [load for load in waiting if _parent_ready(load)]:
            self._complete(ready[0], True)
            waiting.remove(ready[0])
        if not self._ready(live):  # a load of its chain had failed: the request fails
            self.live.remove(live)
            self.kv.release(live.admission)
            return
        self.kv.commit(live.admission, self._keys(live.prompt))
        self.kv.commit(live.admission, self._keys(live.prompt + live.output))
        self.live.remove(live)
        self.kv.release(live.admission)

    @precondition(lambda self: self.pending)
    @rule(index=st.integers(0, 100), ok=st.booleans())
    def complete_load(self, index, ok):
        self._complete(self.pending[index % len(self.pending)], ok)

    def _complete(self, load, ok):
        ok = ok and _parent_ready(load)  # a chain whose parent is not on the GPU fails too
        adopted = [node.on_gpu for node in load.nodes]  # a commit adopted its computed copy
        private = self.kv.tree.private_blocks("gpu")
        self.kv.complete_load(load, ok=ok)
        self.pending.remove(load)
        self.load_ok[load] = ok
        for node, blocks, was_on_gpu in zip(load.nodes, load.gpu_blocks, adopted, strict=True):
            assert not node.loading and node.on_host
            assert node.on_gpu == (ok or was_on_gpu), "a failed load marked a node GPU-resident"
            if ok and not was_on_gpu:
                assert node.gpu_blocks == blocks
            else:
                assert not set(blocks) & set(node.gpu_blocks or [])
        # every destination block was cached or freed
        assert self.kv.tree.private_blocks("gpu") == private - load.num_blocks

    @precondition(lambda self: any(x.stage == 0 and self._ready(x) for x in self.live))
    @rule(index=st.integers(0, 100))
    def commit_prompt(self, index):
        ready = [x for x in self.live if x.stage == 0 and self._ready(x)]
        live = ready[index % len(ready)]
        self.clock.advance()
        self.kv.commit(live.admission, self._keys(live.prompt))
        live.stage = 1

    @precondition(lambda self: any(x.stage < 2 and self._ready(x) for x in self.live))
    @rule(index=st.integers(0, 100))
    def commit_output(self, index):
        ready = [x for x in self.live if x.stage < 2 and self._ready(x)]
        live = ready[index % len(ready)]
        self.clock.advance()
        self.kv.commit(live.admission, self._keys(live.prompt + live.output))
        live.stage = 2

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def release(self, index):
        live = self.live.pop(index % len(self.live))
        self.kv.release(live.admission)
        assert live.admission.done and live.admission.private_blocks == []

    @precondition(lambda self: len(self.active) < len(WORKFLOWS))
    @rule(workflow=st.sampled_from(WORKFLOWS))
    def start_workflow(self, workflow):
        self.kv.on_workflow_started(workflow)
        self.active.add(workflow)
        self.model.start(workflow)
        self.steps[workflow] = 0

    @precondition(lambda self: self.active or self.model.ended)
    @rule(workflow=st.sampled_from(WORKFLOWS), agent=AGENT)
    def invoke(self, workflow, agent):
        """The actor's ``AgentInvoked``; one for a terminated workflow is a late one."""
        if workflow not in self.active and workflow not in self.model.ended:
            return  # the actor starts a workflow before it invokes anything
        step = self.steps.get(workflow, 0)
        self.steps[workflow] = step + 1
        self.kv.on_agent_invoked(workflow, agent, step)
        self.model.invoke(workflow, agent)

    @precondition(lambda self: self.active)
    @rule(workflow=st.sampled_from(WORKFLOWS))
    def terminate_workflow(self, workflow):
        # The actor flow terminates a workflow only after its last request ended.
        busy = {x.admission.request.workflow_id for x in self.live}
        if workflow not in self.active or workflow in busy:
            return
        self.kv.on_workflow_terminated(workflow)
        self.active.discard(workflow)
        self.model.terminate(workflow)

    @precondition(lambda self: self.active)
    @rule(
        workflow=st.sampled_from(WORKFLOWS),
        weights=st.lists(
            st.lists(st.integers(0, 4), min_size=len(AGENTS) + 1, max_size=len(AGENTS) + 1),
            min_size=1,
            max_size=3,
        ),
    )
    def forecast(self, workflow, weights):
        if workflow not in self.active:
            return
        rows = np.array(weights, dtype=float) + np.array([0.0] * len(AGENTS) + [1e-3])
        rows /= rows.sum(axis=1, keepdims=True)
        refreshed = self.kv.on_forecast(workflow, rows, AGENTS)
        if self.kv.policy.uses_forecasts:
            assert refreshed == len(self.kv.scores.nodes_of(workflow))
            self.model.forecast(workflow, rows)
        else:
            assert refreshed == 0

    @precondition(lambda self: self.kv.policy.prefetch != "none")
    @rule(step_s=st.sampled_from([0.1, 0.2, 0.5]))
    def prefetch(self, step_s):
        retired_gpu = sum(n.num_blocks for n in self.kv.tree.nodes() if n.on_gpu and n.retired)
        free_before = self.kv.tree.gpu.num_free
        evicted_active = self.kv.tree.counters.evicted_active_blocks
        loads = self.kv.plan_prefetch(step_s)
        budget = int(self.kv.config.bandwidth_bytes_per_s * step_s / self.kv.config.bytes_per_block)
        issued = sum(load.num_blocks for load in loads)
        assert issued <= min(budget, free_before + retired_gpu)
        assert self.kv.tree.counters.evicted_active_blocks == evicted_active
        for load in loads:
            assert load.prefetch
        self._track(loads)

    @rule(tier=st.sampled_from(["gpu", "gpu", "host"]), n=st.integers(1, 6))
    def evict(self, tier, n):
        cached = self.kv.tree.cached_blocks(tier)
        freed = self.kv.tree.evict(tier, n)
        assert 0 <= freed <= cached

    def teardown(self):
        """Once every request and load has ended, every cached block is evictable (the
        eviction index lost none) and both tiers drain completely."""
        if not hasattr(self, "kv"):
            return
        for live in self.live:
            self.kv.release(live.admission)
        while self.pending:
            self._complete(self.pending[0], ok=True)
        self.kv.check_integrity()
        tree = self.kv.tree
        assert tree.private_blocks("gpu") == 0
        assert all(n.lock_count == 0 for n in tree.nodes())
        tree.evict("gpu", tree.cached_blocks("gpu"))
        assert tree.cached_blocks("gpu") == 0
        tree.evict("host", tree.cached_blocks("host"))
        assert tree.cached_blocks("host") == 0
        assert tree.nodes() == []
        assert tree.gpu.num_free == tree.gpu.capacity_blocks
        assert tree.host.num_free == tree.host.capacity_blocks

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def integrity(self):
        self.kv.check_integrity()
        STEPS_RUN[0] += 1  # invariants run after the setup and after every step

    @invariant()
    def leased_prefixes_stay_cached(self):
        bs = self.kv.config.block_size
        for live in self.live:
            adm = live.admission
            node, path = adm.lease.node, []
            while not node.is_root:
                parent = node.parent
                assert parent.children.get(node.keys[0]) is node, f"{node} left the tree"
                path.insert(0, node)
                node = parent
            assert node is self.kv.tree.root(adm.request.namespace)
            done = live.prompt + live.output if live.stage == 2 else live.prompt
            assert [k for n in path for k in n.keys] == self._keys(done)[: adm.committed_blocks]
            # a leased GPU copy is never demoted: the matched GPU prefix, and after a
            # commit the whole committed sequence, stays on the GPU
            gpu_depth = adm.committed_blocks if live.stage else adm.cached_gpu_tokens // bs
            depth = 0
            for n in path:
                depth += n.num_blocks
                assert n.on_gpu or n.on_host
                assert n.on_gpu or depth > gpu_depth, f"leased {n} left the GPU"

    @invariant()
    def hits_never_exceed_prompts(self):
        s = self.kv.statistics()
        assert s.cached_gpu_tokens + s.cached_host_tokens <= s.prompt_tokens
        assert s.computed_tokens >= 0
        assert s.prefetch_used_blocks + s.prefetch_wasted_blocks <= s.prefetch_issued_blocks

    @invariant()
    def scores_match_the_model(self):
        """Every node's score is Eq. 2 plus the tail and the history blend, from the
        model's call shares, miss rate and evidence (within float rounding)."""
        for node in self.kv.tree.nodes():
            assert set(node.accessors) <= self.active
            if node.accessors:
                assert not node.retired
            if node.retired:
                assert node.score == 0.0
            if not self.kv.policy.uses_forecasts:
                continue
            expected = self.model.score(node)
            assert abs(node.score - expected) <= 1e-9 * max(1.0, abs(expected)), (node, expected)

    @invariant()
    def tail_state_matches_the_model(self):
        """What ``on_agent_invoked`` keeps: the miss rate and the history evidence (the
        board's and each active workflow's mixture weight)."""
        scores = self.kv.scores
        assert abs(scores.miss_rate - self.model.miss_rate) <= 1e-12
        assert abs(scores.history_evidence - self.model.board_evidence) <= 1e-9
        for w in self.active:
            assert abs(scores.history_weight(w) - self.model.history_weight(w)) <= 1e-9, w


def _parent_ready(load):
    parent = load.nodes[0].parent
    return parent is None or parent.is_root or parent.on_gpu


SOAK = os.environ.get("HYPOTHESIS_PROFILE") == "soak"
STEPS_RUN = [0]  # states checked; tests/conftest.py prints it at the end of the run
KVManagerMachine.TestCase.settings = (
    settings.get_profile("soak")  # HYPOTHESIS_PROFILE=soak: ~10^6 steps (tests/conftest.py)
    if SOAK
    else settings(
        max_examples=60,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
)
TestKVManagerMachine = KVManagerMachine.TestCase


# -- regressions the machine found (kept as plain, exact tests) ---------------------------


def test_commit_through_a_node_being_loaded_leaves_no_gap(clock):
    """A request computes past a prefix that another request is reloading meanwhile."""
    mgr = make_manager(clock, "lru", gpu=12, host=8)
    a = mgr.try_admit(AdmitRequest([1, 2, 3, 5], 4, 1))  # nothing cached yet
    run(mgr, clock, [1, 2, 3])
    assert mgr.tree.evict("gpu", 2) == 2  # [2, 3] demoted to the host
    c = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    assert (c.cached_gpu_tokens, c.cached_host_tokens, len(c.loads)) == (1, 2, 1)
    mgr.commit(a, [1, 2, 3, 5])  # [2, 3] adopts a's computed copy while in flight
    mgr.check_integrity()
    m = mgr.tree.match_prefix([1, 2, 3, 5])
    assert (m.gpu_blocks, m.host_blocks) == (4, 0)
    private = mgr.tree.private_blocks("gpu")
    mgr.complete_load(c.loads[0], ok=True)  # the redundant copy is freed, not leaked
    assert mgr.tree.private_blocks("gpu") == private - 2
    for adm in (a, c):
        mgr.release(adm)
    mgr.check_integrity()
    assert mgr.tree.private_blocks("gpu") == 0
    assert mgr.tree.cached_blocks("gpu") == 4


def test_prefetch_never_drops_its_own_candidate(clock):
    """Making room by demoting retired cache must not evict the host copy being loaded."""
    mgr = make_manager(clock, "pbkv", gpu=4, host=2, bandwidth_bytes_per_s=1e6)
    mgr.on_workflow_started("w")
    mgr.on_forecast("w", forecast(coder=1.0), AGENTS_EVICTION)
    run(mgr, clock, [1, 2], "w", "coder")
    mgr.tree.evict("gpu", 2)  # [1, 2] host-only: the host is full
    mgr.on_workflow_started("old")
    run(mgr, clock, [5, 6, 7, 8], "old", "coder")
    mgr.on_workflow_terminated("old")  # the GPU is full of retired cache
    loads = mgr.plan_prefetch(step_s=1.0)
    assert [[n.keys for n in load.nodes] for load in loads] == [[[1, 2]]]
    assert mgr.tree.counters.evicted_retired_blocks == 2
    mgr.check_integrity()
    mgr.complete_load(loads[0], ok=True)
    assert mgr.tree.match_prefix([1, 2]).gpu_blocks == 2
    mgr.check_integrity()
