"""PBKV's score (paper Eq. 2–4): agent weights, incremental refresh, splits (§5.3)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbkv.kvmanager import ScoreBoard, agent_weights, block_keys, validate_forecast, weights
from pbkv.kvmanager import manager as manager_module
from pbkv.kvmanager.policies import SCORE_BAND_RATIO
from pbkv.kvmanager.weights import TAIL_MAX_STEPS, beyond_horizon_mass, history_sharpened

from .conftest import FakeClock, make_manager
from .test_eviction import eviction_order, run

AGENTS = ("planner", "coder", "tester")


def reference_weight(forecast, agent, gamma):
    """``sum_k gamma^(k-1) s^(k) P^(k)[a]`` with ``s^(k) = prod_{j<k} (1 - P^(j)[END])``."""
    col = AGENTS.index(agent)
    total, alive = 0.0, 1.0
    for k, row in enumerate(forecast):
        total += gamma**k * alive * row[col]
        alive *= 1.0 - row[-1]
    return total


# -- agent_weights on hand-computed forecasts ---------------------------------------------


def test_agent_weights_by_hand():
    forecast = np.array(
        [
            [0.2, 0.5, 0.1, 0.2],
            [0.0, 0.6, 0.2, 0.2],
            [0.5, 0.0, 0.0, 0.5],
        ]
    )
    u, next_step = agent_weights(forecast, AGENTS, gamma=0.5)
    # survival 1, .8, .64; decay 1, .5, .25
    assert u == pytest.approx(
        {
            "planner": 0.2 + 0.25 * 0.64 * 0.5,
            "coder": 0.5 + 0.5 * 0.8 * 0.6,
            "tester": 0.1 + 0.5 * 0.8 * 0.2,
        },
        abs=1e-12,
    )
    assert u == pytest.approx({"planner": 0.28, "coder": 0.74, "tester": 0.18}, abs=1e-12)
    assert next_step == {"planner": 0.2, "coder": 0.5, "tester": 0.1}


def test_certain_end_kills_later_steps():
    forecast = np.array([[0.0, 0.0, 0.0, 1.0], [0.5, 0.25, 0.25, 0.0]])
    u, next_step = agent_weights(forecast, AGENTS, gamma=1.0)
    assert u == {"planner": 0.0, "coder": 0.0, "tester": 0.0}
    assert next_step == {"planner": 0.0, "coder": 0.0, "tester": 0.0}


def test_no_decay_with_gamma_one_sums_marginals():
    # step 1: coder .5, END .5; step 2 (alive .5): tester 1 -> marginal .5
    forecast = np.array([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]])
    u, _ = agent_weights(forecast, AGENTS, gamma=1.0)
    assert u == {"planner": 0.0, "coder": 0.5, "tester": 0.5}


def test_decay_discounts_later_steps():
    forecast = np.array([[0.0, 1.0, 0.0, 0.0]] * 3)
    u, _ = agent_weights(forecast, AGENTS, gamma=0.8)
    assert u["coder"] == pytest.approx(1 + 0.8 + 0.64, abs=1e-12)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 5)])
def test_agent_weights_rejects_a_shape_that_does_not_fit(shape):
    with pytest.raises(ValueError, match="does not fit 3 agents"):
        agent_weights(np.zeros(shape), AGENTS, gamma=0.5)


@pytest.mark.parametrize("gamma", [0.0, -0.1, 1.5])
def test_scoreboard_rejects_gamma_outside_unit_interval(gamma):
    with pytest.raises(ValueError, match="gamma"):
        ScoreBoard(lambda node: None, gamma)


# -- incremental refresh == recomputation from scratch -----------------------------------


class Reference:
    """An independent model of Score: which (workflow, agent) touched which block."""

    def __init__(self, mgr, gamma):
        self.mgr = mgr
        self.gamma = gamma
        self.touched: dict[int, set[tuple[str, str]]] = {}  # block key -> (w, agent)
        self.forecasts: dict[str, np.ndarray] = {}
        self.active: set[str] = set()
        self.last: dict[tuple[str, str], list[int]] = {}  # (w, agent) -> its latest prompt

    def start(self, w):
        self.mgr.on_workflow_started(w)
        self.active.add(w)

    def run(self, clock, tokens, w, agent):
        self.active.add(w)
        keys = block_keys(tokens, 1)  # chained: a key names the whole prefix up to it
        run(self.mgr, clock, keys, w, agent)
        # the agent leaves what its previous prompt held and this one does not (its old
        # branch: leave_branch)
        for key in set(self.last.get((w, agent), ())) - set(keys):
            self.touched.get(key, set()).discard((w, agent))
        self.last[(w, agent)] = keys
        for key in keys:
            self.touched.setdefault(key, set()).add((w, agent))

    def forecast(self, w, forecast):
        self.mgr.on_forecast(w, forecast, AGENTS)
        self.forecasts[w] = forecast[: self.mgr.config.horizon]

    def terminate(self, w):
        self.mgr.on_workflow_terminated(w)
        self.active.discard(w)
        self.forecasts.pop(w, None)
        for pairs in self.touched.values():  # a restarted id is a new workflow
            pairs.difference_update({p for p in pairs if p[0] == w})
        self.last = {k: v for k, v in self.last.items() if k[0] != w}

    def expected(self, node_keys):
        """Return ``Score(c)`` and whether ``c`` is retired, from the touches alone."""
        live = {p for key in node_keys for p in self.touched[key]}
        score = sum(
            reference_weight(self.forecasts[w], a, self.gamma)
            for w, a in live
            if w in self.forecasts
        )
        return score, not live

    def check(self):
        for node in self.mgr.tree.nodes():
            score, retired = self.expected(node.keys)
            assert node.score == pytest.approx(score, abs=1e-9), node
            assert node.retired == retired, node
            accessors = {(w, a) for w, agents in node.accessors.items() for a in agents}
            assert accessors == {p for key in node.keys for p in self.touched[key]}
        self.mgr.check_integrity()


def row(**probs):
    r = np.array([probs.get(a, 0.0) for a in AGENTS] + [0.0])
    r[-1] = 1.0 - r.sum()
    return r


def test_incremental_refresh_equals_recomputation(clock):
    mgr = make_manager(clock, "he", gpu=64, host=0, gamma=0.7)
    ref = Reference(mgr, 0.7)
    ref.start("w1")
    ref.start("w2")
    ref.forecast("w1", np.array([row(coder=0.6, tester=0.2), row(tester=0.9)]))
    ref.check()
    ref.run(clock, [1, 2, 3, 4], "w1", "planner")
    ref.check()
    ref.run(clock, [1, 2, 3, 4, 5, 6], "w1", "coder")
    ref.check()
    ref.run(clock, [1, 2, 7], "w2", "coder")  # splits [1,2,3,4]: shared [1,2]
    ref.check()
    ref.forecast("w2", np.array([row(coder=1.0)]))
    ref.check()
    ref.forecast("w1", np.array([row(planner=0.3), row(coder=0.5, tester=0.5)]))  # falls and rises
    ref.check()
    ref.run(clock, [1, 2, 3, 4, 5, 6, 8], "w2", "tester")
    ref.check()
    ref.terminate("w1")
    ref.check()
    assert mgr.tree.match_prefix(block_keys([1, 2, 3, 4], 1)).node.retired is False  # w2 used it
    ref.forecast("w2", np.array([row(tester=0.4, coder=0.1)]))
    ref.check()
    ref.terminate("w2")
    ref.check()
    assert all(n.retired and n.score == 0.0 for n in mgr.tree.nodes())


def test_forecast_refreshes_only_its_workflows_nodes(clock):
    mgr = make_manager(clock, "he", gpu=64, host=0)
    for w in ("w1", "w2"):
        mgr.on_workflow_started(w)
    run(mgr, clock, [1, 2], "w1", "coder")
    run(mgr, clock, [1, 2, 3], "w2", "coder")
    run(mgr, clock, [9], "w2", "tester")
    assert mgr.on_forecast("w1", row(coder=1.0)[None, :], AGENTS) == 1  # [1,2] only
    assert mgr.on_forecast("w2", row(coder=0.5, tester=0.5)[None, :], AGENTS) == 3
    assert mgr.statistics().score_refreshed_nodes == 4
    assert mgr.tree.match_prefix([1, 2]).node.score == pytest.approx(1.5)
    assert mgr.tree.match_prefix([1, 2, 3]).node.score == pytest.approx(0.5)
    assert mgr.tree.match_prefix([9]).node.score == pytest.approx(0.5)


def test_split_nodes_inherit_scores_and_stay_consistent(clock):
    mgr = make_manager(clock, "he", gpu=64, host=0, gamma=0.5)
    mgr.on_workflow_started("w1")
    mgr.on_forecast("w1", np.array([row(coder=0.5), row(coder=1.0)]), AGENTS)
    run(mgr, clock, [1, 2, 3, 4], "w1", "coder")
    whole = mgr.tree.match_prefix([1, 2, 3, 4]).node
    assert whole.score == pytest.approx(0.5 + 0.5 * 0.5)
    top = mgr.tree.match_prefix([1, 2]).node  # splits the node
    assert (top.keys, whole.keys) == ([1, 2], [3, 4])  # the lower half keeps the identity
    assert mgr.tree.match_prefix([1, 2, 3, 4]).path == (top, whole)
    assert top.score == whole.score and top.accessors == whole.accessors
    assert top in mgr.scores.nodes_of("w1") and whole in mgr.scores.nodes_of("w1")
    # a new forecast reaches both halves
    assert mgr.on_forecast("w1", np.array([row(coder=0.2)]), AGENTS) == 2
    assert top.score == pytest.approx(0.2) and whole.score == pytest.approx(0.2)
    # a second workflow uses only the top half: the halves now differ
    mgr.on_workflow_started("w2")
    mgr.on_forecast("w2", np.array([row(tester=0.6)]), AGENTS)
    run(mgr, clock, [1, 2], "w2", "tester")
    assert top.score == pytest.approx(0.8) and whole.score == pytest.approx(0.2)
    mgr.on_workflow_terminated("w1")
    assert (whole.retired, whole.score) == (True, 0.0)
    assert (top.retired, top.score) == (False, pytest.approx(0.6))
    assert mgr.scores.nodes_of("w2") == {top}
    mgr.check_integrity()


def test_next_step_value_is_the_first_forecast_row(clock):
    mgr = make_manager(clock, "pbkv", gpu=64, host=0)
    for w in ("w1", "w2"):
        mgr.on_workflow_started(w)
    run(mgr, clock, [1], "w1", "coder")
    run(mgr, clock, [1], "w1", "tester")
    run(mgr, clock, [1], "w2", "coder")
    mgr.on_forecast("w1", np.array([row(coder=0.25, tester=0.5), row(coder=1.0)]), AGENTS)
    mgr.on_forecast("w2", np.array([row(coder=0.125)]), AGENTS)
    node = mgr.tree.match_prefix([1]).node
    assert mgr.scores.next_step_value(node) == pytest.approx(0.25 + 0.5 + 0.125)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(
                st.just("run"),
                st.lists(st.integers(0, 2), min_size=1, max_size=6),
                st.sampled_from(["w1", "w2", "w3"]),
                st.sampled_from(AGENTS),
            ),
            st.tuples(
                st.just("forecast"),
                st.sampled_from(["w1", "w2", "w3"]),
                st.lists(
                    st.lists(st.integers(0, 3), min_size=4, max_size=4), min_size=1, max_size=4
                ),
            ),
            st.tuples(st.just("terminate"), st.sampled_from(["w1", "w2", "w3"])),
        ),
        max_size=25,
    ),
    gamma=st.sampled_from([0.5, 0.8, 1.0]),
)
def test_random_sequences_keep_scores_exact(ops, gamma):
    clock = FakeClock()
    mgr = make_manager(clock, "he", gpu=256, host=0, gamma=gamma)
    ref = Reference(mgr, gamma)
    for op in ops:
        if op[0] == "run":
            _, tokens, w, agent = op
            if w not in ref.active:
                ref.start(w)
            ref.run(clock, tokens, w, agent)
        elif op[0] == "forecast":
            _, w, weights = op
            if w not in ref.active:  # the actor drops forecasts of ended workflows
                continue
            rows = np.array(weights, dtype=float) + 1e-3
            ref.forecast(w, rows / rows.sum(axis=1, keepdims=True))
        elif op[1] in ref.active:
            ref.terminate(op[1])
        ref.check()


# -- forecasts are validated where they enter (issue 9) -----------------------------------


@pytest.mark.parametrize(
    ("forecast", "reason"),
    [
        (np.array([[-0.5, 1.0, 0.5, 0.0]]), "negative"),
        (np.array([[np.nan, 0.5, 0.25, 0.25]]), "not finite"),
        (np.array([[0.5, 0.5, 0.5, 0.5]]), "sum to 1"),
        (np.array([[0.0, 0.0, 0.0, 3.0]]), "sum to 1"),
        (np.ones((2, 2)) / 2, "does not fit"),
        (np.ones(4) / 4, "does not fit"),
        (np.zeros((0, 4)), "does not fit"),
    ],
)
def test_bad_forecasts_are_refused_with_the_reason(forecast, reason):
    with pytest.raises(ValueError, match=reason):
        validate_forecast(forecast, len(AGENTS))
    with pytest.raises(ValueError, match=reason):
        agent_weights(forecast, AGENTS, 0.8)


def test_a_valid_forecast_passes_within_rounding():
    forecast = np.array([[0.2, 0.3, 0.1, 0.4 + 1e-9]])
    np.testing.assert_array_equal(validate_forecast(forecast, len(AGENTS)), forecast)


def test_the_board_forgets_ended_workflows_beyond_its_memory():
    board = ScoreBoard(lambda node: None, 0.8, ended_memory=100)
    for i in range(1_000):
        board.start(f"w{i}")
        board.terminate(f"w{i}")
    assert board.active_workflows == []
    assert board.ended_workflows == 100  # the most recent ones: a late touch still retires


def test_a_late_touch_retires_what_it_cached(clock):
    mgr = make_manager(clock, "he", gpu=64, host=0)
    mgr.on_workflow_started("w")
    run(mgr, clock, [1, 2], "w", "coder")
    mgr.on_workflow_terminated("w")
    run(mgr, clock, [1, 2, 3], "w", "coder")  # a request that outlived its workflow
    late = mgr.tree.match_prefix([1, 2, 3]).path[-1]
    assert late.keys == [3] and late.accessors == {} and late.retired
    assert mgr.tree.match_prefix([1, 2]).node.retired
    mgr.on_workflow_started("v")
    run(mgr, clock, [1, 2, 3, 4], "v", "coder")  # an active workflow's use revives it
    assert not late.retired and set(late.accessors) == {"v"}


# -- past the horizon (issue 13 item 8) ---------------------------------------------------


def test_the_tail_past_the_horizon_by_hand():
    forecast = np.array([[0.0, 0.9, 0.0, 0.1], [0.5, 0.0, 0.4, 0.1]])
    plain, _ = agent_weights(forecast, AGENTS, gamma=0.5)
    u, _ = agent_weights(forecast, AGENTS, gamma=0.5, call_shares={"tester": 0.6}, tail_weight=0.5)
    # s^(3) = .9 * .9; mass = .5^2 * .81 / (1 - .5 * .9)
    mass = 0.25 * 0.81 / 0.55
    assert u["tester"] == pytest.approx(plain["tester"] + 0.5 * 0.6 * mass, abs=1e-12)
    assert u["planner"] == plain["planner"] and u["coder"] == plain["coder"]
    assert agent_weights(forecast, AGENTS, 0.5, {"tester": 0.6}, tail_weight=0.0)[0] == plain


def test_a_context_whose_next_call_lies_past_the_horizon_keeps_weight(clock):
    scores = {}
    for beyond in (True, False):
        mgr = make_manager(clock, "he", gpu=64, host=0, beyond_horizon=beyond)
        mgr.on_workflow_started("w1")
        mgr.on_agent_invoked("w1", "tester", 0)
        run(mgr, clock, [1, 2, 3], "w1", "tester")
        # the forecast sees only planner and coder for K = 2 steps: tester lies beyond
        mgr.on_forecast("w1", np.array([row(planner=1.0), row(coder=1.0)]), AGENTS)
        scores[beyond] = mgr.tree.match_prefix([1, 2, 3]).node.score
    assert scores[False] == 0.0  # Eq. 2 as written: the context it just computed weighs nothing
    assert scores[True] > 0.0


def test_the_tail_follows_how_often_the_forecasts_miss(clock):
    mgr = make_manager(clock, "he", gpu=64, host=0)
    board = mgr.scores
    mgr.on_workflow_started("w1")
    assert board.miss_rate == 1.0  # unchecked forecasts get no trust
    for step in range(100):  # forecasts that name the next agent
        mgr.on_forecast("w1", np.array([row(coder=1.0)]), AGENTS)
        mgr.on_agent_invoked("w1", "coder", step)
    right = board.miss_rate
    for step in range(100, 200):  # forecasts that never do
        mgr.on_forecast("w1", np.array([row(planner=1.0)]), AGENTS)
        mgr.on_agent_invoked("w1", "coder", step)
    assert right < 0.2 < 0.8 < board.miss_rate <= 1.0


# -- the workflow's history within the horizon (issue 13 item 8) --------------------------


def test_history_sharpened_by_hand():
    # P = .3 each, END .1; shares: coder .5; eps .05 -> P (h + eps) = .015, .165, .015
    q = history_sharpened([0.3, 0.3, 0.3, 0.1], AGENTS, {"coder": 0.5})
    assert q == pytest.approx([0.9 * 0.05 / 0.65, 0.9 * 0.55 / 0.65, 0.9 * 0.05 / 0.65])
    assert history_sharpened(row(coder=1.0).tolist(), AGENTS, {"tester": 1.0}) == [0, 1, 0]
    assert history_sharpened(row().tolist(), AGENTS, {"coder": 1.0}) == [0, 0, 0]  # END only


def test_the_history_blend_by_hand():
    forecast = np.array([[0.3, 0.3, 0.3, 0.1], row(planner=0.5, tester=0.5)])
    shares = {"coder": 0.5}
    # gamma^(k-1) s^(k): 1, .5 * .9; row 2 gives coder nothing, so Q^(2) = P^(2)
    plain = {"planner": 0.3 + 0.45 * 0.5, "coder": 0.3, "tester": 0.3 + 0.45 * 0.5}
    sharp = {"planner": 0.045 / 0.65 + 0.225, "coder": 0.495 / 0.65, "tester": 0.045 / 0.65 + 0.225}
    u, first = agent_weights(forecast, AGENTS, 0.5, shares, tail_weight=0.0, history_weight=0.5)
    assert u == pytest.approx({a: (plain[a] + sharp[a]) / 2 for a in AGENTS}, abs=1e-12)
    assert first == dict(zip(AGENTS, [0.3, 0.3, 0.3], strict=True))  # the forecast's own P^(1)
    same, _ = agent_weights(forecast, AGENTS, 0.5, shares, tail_weight=0.0, history_weight=0.0)
    assert same == agent_weights(forecast, AGENTS, 0.5)[0]


def test_the_history_weight_follows_which_expert_predicts_the_calls(clock):
    mgr = make_manager(clock, "pbkv", gpu=64, host=0)
    board = mgr.scores
    mgr.on_workflow_started("w1")
    assert board.history_weight("w1") == pytest.approx(0.1)  # the prior: odds 1:9
    flat = np.array([row(planner=0.3, coder=0.3, tester=0.3)])
    for step in range(10):  # a forecast that cannot tell the agents apart, a coder loop
        mgr.on_agent_invoked("w1", "coder", step)
        mgr.on_forecast("w1", flat, AGENTS)
    assert board.history_weight("w1") > 0.99
    for step in range(10, 70):  # a cycle: the forecast leans right, the history wrong
        after = AGENTS[step % 3]  # the agent called least recently, so the least shared
        leaning = row(**{**dict.fromkeys(AGENTS, 0.2), after: 0.6})
        mgr.on_forecast("w1", np.array([leaning]), AGENTS)
        mgr.on_agent_invoked("w1", after, step)
    assert board.history_weight("w1") == 0.0
    mgr.on_workflow_started("w2")  # a new workflow starts from the board's evidence
    assert board.history_weight("w2") == board.history_weight("w1") == 0.0


def test_a_sharp_forecast_keeps_eq_2_exactly(clock):
    scores = {}
    for beyond in (True, False):
        mgr = make_manager(clock, "pbkv", gpu=64, host=0, beyond_horizon=beyond)
        mgr.on_workflow_started("w1")
        for step, agent in enumerate(["planner", "coder", "tester"] * 4):
            run(mgr, clock, [10 * step + 1, 10 * step + 2], "w1", agent)
            mgr.on_agent_invoked("w1", agent, step)
            after = AGENTS[(AGENTS.index(agent) + 1) % 3]
            mgr.on_forecast("w1", np.array([row(**{after: 1.0}), row()]), AGENTS)
        scores[beyond] = [n.score for n in sorted(mgr.scores.nodes_of("w1"), key=id)]
    # the tail is 0 (the last row ends the workflow); a row naming one agent is not
    # sharpened: the same scores
    assert sorted(scores[True]) == sorted(scores[False])


def test_a_context_whose_agent_the_workflow_keeps_calling_ranks_above_an_idle_one(clock):
    mgr = make_manager(clock, "pbkv", gpu=64, host=0)
    mgr.on_workflow_started("w1")
    mgr.on_agent_invoked("w1", "planner", 0)
    run(mgr, clock, [1, 2, 3], "w1", "planner")  # planner's context, used once
    # markov-1 after a call: planner a bit likelier than the others, then END (no tail)
    leaning = np.array([row(planner=0.4, coder=0.3, tester=0.3), row()])
    mgr.on_forecast("w1", leaning, AGENTS)
    coder = [4]
    for step in range(1, 9):  # yet the workflow keeps calling coder
        mgr.on_agent_invoked("w1", "coder", step)
        coder.append(4 + step)
        run(mgr, clock, coder, "w1", "coder")
        mgr.on_forecast("w1", leaning, AGENTS)
    idle = mgr.tree.match_prefix([1, 2, 3]).node
    busy = mgr.tree.match_prefix(coder).node
    eq_2, _ = agent_weights(leaning, AGENTS, mgr.scores.gamma)
    assert eq_2["coder"] < eq_2["planner"]  # Eq. 2 alone ranks coder's context below
    assert busy.score > idle.score
    assert mgr.policy.priority(busy) > mgr.policy.priority(idle)  # evicted after it


def test_the_tail_stays_finite_at_gamma_one_without_end():
    """gamma = 1 with END never forecast: the geometric tail would diverge; it counts at
    most TAIL_MAX_STEPS steps (found as a ZeroDivisionError that crashed the actor)."""
    forecast = np.zeros((3, 3))
    forecast[:, 0] = 1.0
    u, _ = agent_weights(forecast, ("a", "b"), 1.0, {"a": 0.5, "b": 0.5})
    assert u == {"a": 3.0 + 0.5 * TAIL_MAX_STEPS, "b": 0.5 * TAIL_MAX_STEPS}
    assert beyond_horizon_mass(forecast, 0.8) == pytest.approx(0.8**3 / 0.2)  # unchanged


# -- the refresh is the straightforward one, bit for bit (issue 13 item 7) ---------------


def straightforward_weights(forecast, agents, gamma, shares=None, tail_weight=1.0, mix=0.0):
    """Eq. 2-4 with the tail and the history blend as :func:`agent_weights` documents
    them, one float operation after another in the order the formulas read."""
    rows = np.asarray(forecast, dtype=np.float64).tolist()
    steps, alive = [], 1.0
    for k, r in enumerate(rows):
        steps.append(gamma**k * alive)  # gamma^(k-1) s^(k)
        alive *= 1.0 - r[-1]
    if len(rows) > 3:  # numpy's matmul decides the order of a longer sum
        u = (np.array(steps) @ np.asarray(forecast, dtype=np.float64)[:, :-1]).tolist()
    else:
        u = []
        for j in range(len(agents)):
            total = steps[0] * rows[0][j]
            for k in range(1, len(rows)):
                total = total + steps[k] * rows[k][j]
            u.append(total)
    weights = dict(zip(agents, u, strict=True))
    if shares and mix > 0.0:
        sharp, step = dict.fromkeys(agents, 0.0), 1.0
        for r in rows:
            for a, q in zip(agents, history_sharpened(r, agents, shares), strict=True):
                sharp[a] += step * q
            step *= gamma * (1.0 - r[-1])
        for a in agents:
            weights[a] += mix * (sharp[a] - weights[a])
    if shares:
        ratio = 1.0 - gamma * (1.0 - rows[-1][-1])
        mass = gamma ** len(rows) * alive * TAIL_MAX_STEPS
        if ratio * TAIL_MAX_STEPS > 1.0:
            mass = gamma ** len(rows) * alive / ratio
        for a, share in shares.items():
            if a in weights:
                weights[a] += tail_weight * mass * share
    return weights, dict(zip(agents, rows[0][: len(agents)], strict=True))


def bits(values):
    return {k: float(v).hex() for k, v in values.items()}


def random_forecast(rng, k, n):
    forecast = rng.dirichlet(np.full(n + 1, rng.uniform(0.2, 2.0)), size=k)
    if rng.random() < 0.3:  # exact zeros, as sharp models give
        forecast[:, rng.integers(n + 1)] = 0.0
        forecast /= forecast.sum(axis=1, keepdims=True)
    return forecast


def test_the_weights_are_the_straightforward_ones_bit_for_bit():
    rng = np.random.default_rng(7)
    for trial in range(3000):
        k, n = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        agents = tuple(f"a{i}" for i in range(n))
        forecast = random_forecast(rng, k, n)
        gamma = float(rng.choice([0.8, 0.5, 1.0, rng.uniform(0.05, 1.0)]))
        shares = None
        if trial % 3:
            shares = dict(zip(agents, rng.dirichlet(np.ones(n)).tolist(), strict=True))
        tail, mix = float(rng.random()), float(rng.choice([0.0, rng.random()]))
        expected = straightforward_weights(forecast, agents, gamma, shares, tail, mix)
        # float64, float32, a list, a Fortran-ordered copy: what the boundary may be given
        given = [
            forecast,
            forecast.astype(np.float32),
            forecast.tolist(),
            np.asfortranarray(forecast),
        ]
        for form in given[:1] if trial % 4 else given:
            if form is not forecast:
                expected = straightforward_weights(form, agents, gamma, shares, tail, mix)
            u, first = agent_weights(form, agents, gamma, shares, tail, mix)
            assert (bits(u), bits(first)) == tuple(map(bits, expected)), (trial, form)
            board = ScoreBoard(lambda node: None, gamma)  # its own gamma powers, taken once
            u, first = weights._agent_weights(form, agents, gamma, board._powers, shares, tail, mix)
            assert (bits(u), bits(first)) == tuple(map(bits, expected)), (trial, form)


class StraightforwardBoard(ScoreBoard):
    """The refresh as Eq. 2 reads: weights from :func:`straightforward_weights`, each
    group's change summed per agent in the group's order, each node re-keyed alone."""

    blended = 0

    def set_forecast(self, workflow_id, forecast, agents):
        shares = self._call_shares.get(workflow_id) if self.beyond_horizon else None
        mix = self.history_weight(workflow_id) if shares else 0.0
        StraightforwardBoard.blended += mix > 0.0
        new, first = straightforward_weights(
            forecast, agents, self.gamma, shares, self.miss_rate, mix
        )
        if workflow_id in self._ended:
            return 0
        self.start(workflow_id)
        flow = self._flows[workflow_id]
        old = dict(zip(flow.agents, flow.weights, strict=False))  # the 0 slot left out
        for agents_used, group in self._groups[workflow_id].items():
            delta = sum(new.get(a, 0.0) - old.get(a, 0.0) for a in agents_used)
            if delta:
                for node in group:
                    node.score += delta
                    self._reprioritize(node)
        flow.agents = tuple(agents)
        flow.position = {a: i for i, a in enumerate(agents)}
        flow.weights = [new[a] for a in agents] + [0.0]
        flow.first = [first[a] for a in agents]
        return len(self._nodes[workflow_id])


def straightforward_key(node):
    """pbkv's eviction key with Python's own ``round`` (see ``workflow_priority``)."""
    value = round(node.score + node.queued, 12)
    band = math.floor(math.log(value) / math.log(SCORE_BAND_RATIO)) if value > 0 else -math.inf
    return (not node.retired, band, -node.oldest, value, node.last_access_s, node.serial)


def check_against_the_straightforward_board(clock, monkeypatch, agent_sets, seed, horizons):
    """Two managers, one with the straightforward board, through the same random touches,
    calls, forecasts and ends, with evictions: the same scores to the last bit, the same
    trees, and the eviction order of the key computed with ``round``. Each forecast names
    one of ``agent_sets`` (a call, the first of them)."""
    fast = make_manager(clock, "pbkv", gpu=48, host=0, horizon=4)
    monkeypatch.setattr(manager_module, "ScoreBoard", StraightforwardBoard)
    plain = make_manager(clock, "pbkv", gpu=48, host=0, horizon=4)
    assert type(plain.scores) is StraightforwardBoard
    StraightforwardBoard.blended = 0
    rng = np.random.default_rng(seed)
    agents, contexts = agent_sets[0], {}
    for step in range(400):
        w = f"w{rng.integers(6)}"
        if w not in contexts:
            contexts[w] = [1, 2, 3, 100 + int(rng.integers(1_000_000))]
            for mgr in (fast, plain):
                mgr.on_workflow_started(w)
        op = rng.random()
        if op < 0.4:  # a call, mostly of the workflow's favourite agent
            agent = agents[int(w[1:]) % 4] if rng.random() < 0.7 else str(rng.choice(agents))
            contexts[w] += rng.integers(10, 1_000_000, int(rng.integers(1, 4))).tolist()
            for mgr in (fast, plain):
                mgr.on_agent_invoked(w, agent, step)
                run(mgr, clock, contexts[w], w, agent)
        elif op < 0.9:
            named = agent_sets[int(rng.integers(len(agent_sets)))]
            forecast = random_forecast(rng, int(rng.choice(horizons)), len(named))
            assert fast.on_forecast(w, forecast, named) == plain.on_forecast(w, forecast, named)
        else:
            del contexts[w]
            for mgr in (fast, plain):
                mgr.on_workflow_terminated(w)
        ours = {tuple(n.keys): n.score.hex() for n in fast.tree.nodes()}
        assert ours == {tuple(n.keys): n.score.hex() for n in plain.tree.nodes()}
        fast.check_integrity()  # the plans are those of the groups
    assert StraightforwardBoard.blended > 20  # the history blend ran, not only Eq. 2
    assert fast.statistics().evicted_active_blocks > 20  # evictions ranked by the scores
    for mgr in (fast, plain):
        leaves = sorted(
            (n for n in mgr.tree.nodes() if mgr.tree._gpu_candidate(n)), key=straightforward_key
        )
        assert mgr.tree.lowest_candidate("gpu") is leaves[0]
    assert eviction_order(fast, 20) == eviction_order(plain, 20)


PLANNERS = ("planner", "coder", "tester", "analyzer")


def test_the_refresh_is_the_straightforward_one_bit_for_bit(clock, monkeypatch):
    """Forecasts of K = 1..4 over one set of agents."""
    check_against_the_straightforward_board(clock, monkeypatch, [PLANNERS], 3, (1, 2, 3, 4))


def test_the_default_horizon_refresh_is_the_straightforward_one_bit_for_bit(clock, monkeypatch):
    """K = 3 forecasts only: every one takes the one-pass fold and the group plans."""
    check_against_the_straightforward_board(clock, monkeypatch, [PLANNERS], 7, (3,))


def test_a_refresh_whose_agents_change_is_the_straightforward_one(clock, monkeypatch):
    """Forecasts naming the agents in another order, a subset, one unknown agent, or as a
    list: each change of names re-plans the groups by name, as the per-agent sums read."""
    agent_sets = [
        PLANNERS,
        PLANNERS,
        tuple(reversed(PLANNERS)),
        ("planner", "coder"),
        ("tester", "analyzer", "critic"),
        list(PLANNERS),
    ]
    check_against_the_straightforward_board(clock, monkeypatch, agent_sets, 11, (3, 3, 2))


EDGE_FORECASTS = {
    "plain": [[0.5, 0.2, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "exact zeros": [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
    "a negative zero": [[-0.0, 0.5, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a tiny negative value": [[-1e-300, 0.5, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a negative value": [[-0.1, 0.6, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a negative NaN": [[-np.nan, 0.5, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "NaN": [[np.nan, 0.5, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "infinity": [[np.inf, 0.5, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a sum within the tolerance": [[0.5, 0.2, 0.30008], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a sum past the tolerance": [[0.5, 0.2, 0.3002], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]],
    "a last row past the tolerance": [[0.5, 0.2, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.3]],
}


@pytest.mark.parametrize("name", EDGE_FORECASTS)
@pytest.mark.parametrize("form", ["float64", "float32", "fortran", "big-endian", "list"])
def test_the_one_pass_fold_accepts_and_folds_as_the_full_check(name, form):
    """The default horizon's one-pass check accepts only what ``validate_forecast``
    accepts, and the board then refreshes or refuses exactly as ``agent_weights`` does."""
    forecast = np.array(EDGE_FORECASTS[name])
    given = {
        "float64": forecast,
        "float32": forecast.astype(np.float32),
        "fortran": np.asfortranarray(forecast),
        "big-endian": forecast.astype(">f8"),
        "list": forecast.tolist(),
    }[form]
    agents = ("planner", "coder")
    board = ScoreBoard(lambda node: None, 0.8)
    folded = weights.fold_default(given, len(agents), board._powers)
    try:
        expected = agent_weights(given, agents, 0.8)
    except ValueError as exc:
        assert folded is None
        with pytest.raises(ValueError, match=str(exc).split(" ")[0]):
            board.set_forecast("w", given, agents)
        return
    assert board.set_forecast("w", given, agents) == 0
    flow = board._flows["w"]
    assert bits(dict(zip(agents, flow.weights, strict=False))) == bits(expected[0])
    assert bits(flow.predicted()) == bits(expected[1])
    if folded is not None:
        assert bits(dict(zip(agents, folded[1], strict=False))) == bits(expected[0])
    clear = ("plain", "exact zeros")  # the rest goes to the full check
    assert (folded is not None) == (form in ("float64", "fortran") and name in clear)


def test_agents_named_twice_are_refused(clock):
    mgr = make_manager(clock)
    mgr.on_workflow_started("w")
    forecast = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="twice"):
        mgr.scores.set_forecast("w", forecast, ("coder", "coder"))
    assert mgr.on_forecast("w", forecast, ("coder", "coder")) == 0
    assert mgr.statistics().rejected_forecasts == 1


def test_a_plan_that_misses_a_group_fails_the_integrity_check(clock):
    mgr = make_manager(clock)
    mgr.on_workflow_started("w")
    run(mgr, clock, [1, 2, 3], "w", "planner")
    run(mgr, clock, [1, 2, 3, 4], "w", "coder")
    mgr.on_forecast("w", np.full((3, 4), 0.25), AGENTS)  # names the agents: no plan yet
    mgr.on_forecast("w", np.array([[0.4, 0.3, 0.2, 0.1]] * 3), AGENTS)  # plans the groups
    mgr.check_integrity()
    flow = mgr.scores._flows["w"]
    assert len(flow.plan) == 2  # {planner, coder} and {planner}
    flow.plan = flow.plan[:1]  # as if a group had come without the plan being forgotten
    with pytest.raises(AssertionError, match="plan"):
        mgr.scores.check_integrity()
