"""Admission, host reloads, single-flight loads and conservative prefetch (§5.4)."""

import numpy as np
import pytest

from pbkv.kvmanager import AdmitRequest

from .conftest import make_manager
from .test_eviction import AGENTS, eviction_order, run


def test_admission_reserves_prompt_and_output(clock):
    mgr = make_manager(clock, "lru", gpu=10, host=0, block_size=2)
    adm = mgr.try_admit(AdmitRequest([1, 2], prompt_tokens=5, max_new_tokens=3))
    assert adm is not None
    assert len(adm.private_blocks) == 4  # ceil(8 / 2)
    assert adm.computed_tokens == 5
    mgr.check_integrity()
    mgr.release(adm)
    mgr.release(adm)  # idempotent
    assert mgr.tree.gpu.num_free == 10
    mgr.check_integrity()


def test_request_larger_than_gpu_is_an_error(clock):
    mgr = make_manager(clock, "lru", gpu=4)
    with pytest.raises(ValueError, match="needs 5 GPU blocks"):
        mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5], 5, 0))


def test_full_gpu_of_leased_blocks_rejects_then_admits(clock):
    mgr = make_manager(clock, "lru", gpu=4, host=0)
    first = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 0))
    assert mgr.try_admit(AdmitRequest([7, 8], 2, 0)) is None
    assert mgr.statistics().rejected_admissions == 1
    mgr.commit(first, [1, 2, 3])
    mgr.release(first)
    assert mgr.try_admit(AdmitRequest([7, 8], 2, 0)) is not None
    mgr.check_integrity()


def test_host_hit_is_reloaded_not_recomputed(clock):
    mgr = make_manager(clock, "lru", gpu=4, host=8)
    run(mgr, clock, [1, 2, 3])
    run(mgr, clock, [7, 8, 9])  # needs 2 more blocks: the tail [2,3] is demoted to host
    adm = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    assert (adm.cached_gpu_tokens, adm.cached_host_tokens, adm.computed_tokens) == (1, 2, 0)
    assert len(adm.loads) == 1 and adm.loads[0].num_blocks == 2
    mgr.complete_load(adm.loads[0], ok=True)
    mgr.commit(adm, [1, 2, 3])
    mgr.release(adm)
    s = mgr.statistics()
    assert s.h2d_bytes == 200 and s.d2h_bytes >= 200
    mgr.check_integrity()


def test_concurrent_requests_join_one_load(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)
    a = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 0))
    b = mgr.try_admit(AdmitRequest([1, 2, 3, 4], 4, 0))
    assert a.loads == b.loads and len(a.loads) == 1
    mgr.check_integrity()
    mgr.complete_load(a.loads[0], ok=True)
    for adm in (a, b):
        mgr.commit(adm, [1, 2, 3, 4][: adm.request.prompt_tokens])
        mgr.release(adm)
    assert mgr.statistics().h2d_bytes == 300
    mgr.check_integrity()


def test_bad_forecasts_are_counted_and_never_become_scores(clock, caplog):
    mgr = make_manager(clock, "pbkv", gpu=64, host=0)
    mgr.on_workflow_started("w")
    run(mgr, clock, [1, 2], "w", "coder")
    node = mgr.tree.match_prefix([1, 2]).node
    bad = [
        np.ones((3, 2)),  # wrong shape: used to kill the KV-manager actor
        np.array([[-3.0, 0.0, 0.0, 4.0]]),  # negative: became a score of -3.0
        np.array([[0.0, np.nan, 0.0, 1.0]]),  # NaN: broke the eviction heap
        np.array([[0.5, 0.5, 0.5, 0.5]]),  # unnormalised
        np.array([[0.0, 0.0, 0.0, 2.0]]),  # END > 1
    ]
    for forecast in bad:
        assert mgr.on_forecast("w", forecast, AGENTS) == 0
    assert mgr.statistics().rejected_forecasts == len(bad)
    assert node.score == 0.0
    assert caplog.text.count("rejected forecast for workflow w") == len(bad)
    assert mgr.on_forecast("w", np.array([[0.0, 0.5, 0.0, 0.5]]), AGENTS) == 1
    assert node.score == pytest.approx(0.5)


def test_nan_forecasts_keep_the_eviction_order_exact(clock):
    # 300 single-node workflows with NaN forecasts used to give 34 order inversions
    mgr = make_manager(clock, "he", gpu=300, host=0)
    rng = np.random.default_rng(0)
    for i in range(300):
        w = f"w{i}"
        mgr.on_workflow_started(w)
        run(mgr, clock, [1000 + i], w, "coder")
        p = rng.random() if i % 3 else np.nan
        mgr.on_forecast(w, np.array([[0.0, p, 0.0, 1.0 - p]]), AGENTS)
    scores = []
    while (victim := mgr.tree.lowest_candidate("gpu")) is not None:
        scores.append(victim.score)
        mgr.tree.evict("gpu", victim.num_blocks)
    assert len(scores) == 300 and not np.isnan(scores).any()
    assert scores == sorted(scores)


def test_commit_over_a_failed_load_raises_and_leaks_nothing(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)
    adm = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))
    mgr.complete_load(adm.loads[0], ok=False)
    with pytest.raises(ValueError, match="not on the GPU"):
        mgr.commit(adm, [1, 2, 3])
    mgr.release(adm)
    assert mgr.tree.private_blocks("gpu") == 0
    mgr.check_integrity()


def test_a_failed_demotion_copy_is_forgotten(clock):
    mgr = make_manager(clock, "lru", gpu=8, host=8)
    run(mgr, clock, [1, 2, 3])
    mgr.tree.evict("gpu", 3)  # demoted: the engine's device-to-host copy then fails
    host_blocks = set(mgr.tree.match_prefix([1, 2, 3]).node.host_blocks)
    assert mgr.discard_host_blocks(host_blocks) == 1
    assert mgr.tree.match_prefix([1, 2, 3]).host_blocks == 0
    assert mgr.tree.nodes() == []
    mgr.check_integrity()


def test_shortfall_and_release_gain_leave_out_the_waiting_requests_own_prefix(clock):
    mgr = make_manager(clock, "lru", gpu=7, host=0)
    shared = mgr.try_admit(AdmitRequest([1, 2], 2, 0))
    mgr.commit(shared, [1, 2])
    mgr.release(shared)  # [1, 2] cached, unleased
    victim = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 1))  # matches [1, 2]; 2 private
    mgr.commit(victim, [1, 2, 3])  # [3] cached under [1, 2]; 1 private left
    waiting = AdmitRequest([1, 2, 8, 9], 4, 2)  # 6 blocks, 2 of them cached: needs 4
    assert mgr.tree.gpu.num_free == 3
    assert mgr.gpu_shortfall(waiting) == 1  # nothing evictable: the victim leases [1, 2, 3]
    assert mgr.release_gain([victim], waiting) == 2  # its private block and [3], not [1, 2]
    mgr.release(victim)
    assert mgr.gpu_shortfall(waiting) == 0
    assert mgr.try_admit(waiting) is not None
    mgr.check_integrity()


def test_a_resumed_admission_is_not_counted_as_a_request(clock):
    from pbkv.kvmanager.bounds import AccessLog

    mgr = make_manager(clock, "lru", gpu=16, host=0)
    mgr.access_log = AccessLog(block_size=1)
    first = mgr.try_admit(AdmitRequest([1, 2, 3], 3, 4))
    mgr.commit(first, [1, 2, 3, 4])  # prompt and one generated token, then retracted
    mgr.release(first)
    resumed = mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5], 5, 3, resumed=True))
    assert resumed is not None and resumed.cached_gpu_tokens == 4
    stats = mgr.statistics()
    assert (stats.requests, stats.prompt_tokens, stats.computed_tokens) == (1, 3, 3)
    assert (stats.resumed_admissions, stats.resumed_computed_tokens) == (1, 1)
    assert [is_access for is_access, _ in mgr.access_log.events] == [True, False]


def test_prefix_in_flight_until_the_computing_request_commits(clock):
    mgr = make_manager(clock, "lru", gpu=16, host=0)
    run(mgr, clock, [1, 2])  # [1, 2] cached
    first = mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5], 5, 1))  # computes 3, 4, 5
    assert mgr.prefix_in_flight([1, 2, 3, 9])  # its next block, 3, is being computed
    assert not mgr.prefix_in_flight([1, 2, 7])  # 7 is nobody's
    assert not mgr.prefix_in_flight([1, 2])  # nothing past the cached prefix
    mgr.commit(first, [1, 2, 3])  # a chunk's blocks land
    assert not mgr.prefix_in_flight([1, 2, 3])  # cached now: a hit
    assert mgr.prefix_in_flight([1, 2, 3, 4])  # 4 still computing
    mgr.release(first)  # ends without committing 4 and 5
    assert not mgr.prefix_in_flight([1, 2, 3, 4, 5])
    assert not mgr._computing  # every count given back
    mgr.check_integrity()


def test_shortfall_and_release_gain_count_the_tail_of_a_node_the_prefix_ends_inside(clock):
    """A waiting prompt that diverges inside a node owns only the blocks it matches:
    the node's tail is evictable for it (eviction splits the node and takes the tail)."""
    mgr = make_manager(clock, "lru", gpu=8, host=0)
    victim = mgr.try_admit(AdmitRequest([1, 2, 3, 4, 5], 5, 1))  # 6 private blocks
    mgr.commit(victim, [1, 2, 3, 4, 5])  # one node
    assert [n.num_blocks for n in mgr.tree.nodes()] == [5]
    waiting = AdmitRequest([1, 2, 8], 3, 1)  # 4 blocks, 2 cached: needs 2, 2 are free
    assert mgr.gpu_shortfall(waiting) == 0
    big = AdmitRequest([1, 2, 8, 9, 10, 11], 6, 1)  # needs 5: 2 free, nothing evictable
    assert mgr.gpu_shortfall(big) == 3
    # released: its private block, and [3, 4, 5] of the node, not the matched [1, 2]
    assert mgr.release_gain([victim], big) == 1 + 3
    mgr.release(victim)
    assert mgr.gpu_shortfall(big) == 0
    assert mgr.try_admit(big) is not None
    mgr.check_integrity()


def test_prefix_in_flight_counts_every_request_computing_a_block(clock):
    mgr = make_manager(clock, "lru", gpu=16, host=0)
    a = mgr.try_admit(AdmitRequest([1, 2], 2, 1))
    b = mgr.try_admit(AdmitRequest([1, 2], 2, 1))  # admitted anyway: computes them too
    mgr.release(a)
    assert mgr.prefix_in_flight([1, 2])  # b still computes them
    mgr.commit(b, [1, 2])
    mgr.release(b)
    assert not mgr.prefix_in_flight([1, 2]) and not mgr._computing


def _tree_state(mgr):
    nodes = sorted(mgr.tree.nodes(), key=lambda n: n.serial)
    return [
        (n.serial, tuple(n.keys), n.last_access_s, n.lock_count, n.score.hex(), n.retired,
         tuple(sorted((w, tuple(sorted(a))) for w, a in n.accessors.items())))
        for n in nodes
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["lru", "pbkv"])
def test_chunk_commits_below_the_lease_are_the_full_inserts(clock, monkeypatch, policy):
    """Commits that extend a request's leased prefix (:meth:`RadixTree.insert_below`,
    :meth:`AccessLog.insert_extending`) leave the same tree, timestamps, scores, access
    log, eviction order and statistics as inserting each whole prefix from the root, on
    random contested chunked prefills with cancellations (released mid-prefill) and
    shared prefixes split by other requests between a request's chunks."""
    from pbkv.kvmanager import AccessLog, ceiling_hits, min_hits

    class FullLog(AccessLog):  # logs every commit's whole sequence
        def insert_extending(self, previous, keys, namespace, prompt_blocks):
            self.insert(keys, namespace, prompt_blocks)
            return None

    def manager(log):
        mgr = make_manager(clock, policy, gpu=40, host=0)
        mgr.access_log = log
        for w in ("w0", "w1", "w2"):
            mgr.on_workflow_started(w)
        return mgr

    fast, plain = manager(AccessLog(1)), manager(FullLog(1))
    tree = plain.tree  # every commit inserts the whole sequence from the root
    monkeypatch.setattr(tree, "insert_below", lambda n, k, b: tree.insert(k, b, n.namespace))
    rng = np.random.default_rng(5)
    prompts = [[1, 2, 3, *range(10 * w, 10 * w + 9)] for w in range(4)]
    running = {}  # id -> (fast admission, plain admission, keys)
    below = 0
    for step in range(300):
        clock.advance()
        op = rng.random()
        if op < 0.35 and len(running) < 4:
            base = prompts[int(rng.integers(4))]
            keys = base[: int(rng.integers(2, len(base) + 1))] + [1000 + step]
            w, agent = f"w{rng.integers(3)}", str(rng.choice(["a", "b"]))
            pair = [mgr.try_admit(AdmitRequest(list(keys), len(keys), 2, w, agent))
                    for mgr in (fast, plain)]  # fmt: skip
            assert (pair[0] is None) == (pair[1] is None)
            if pair[0] is not None:
                running[step] = (*pair, keys)
        elif running:
            key = list(running)[int(rng.integers(len(running)))]
            a, b, keys = running[key]
            if op < 0.9 and a.committed_blocks < len(keys):
                upto = min(len(keys), a.committed_blocks + int(rng.integers(1, 4)))
                below += a.committed_blocks > 0
                fast.commit(a, keys[:upto])
                plain.commit(b, keys[:upto])
            else:  # done, or cancelled mid-prefill
                fast.release(a)
                plain.release(b)
                del running[key]
        assert _tree_state(fast) == _tree_state(plain)
        # the extending log drops re-offered keys: the same bounds, not the same events
        assert fast.access_log.accessed_blocks == plain.access_log.accessed_blocks
        if step % 50 == 0:
            assert ceiling_hits(fast.access_log) == ceiling_hits(plain.access_log)
            for capacity in (4, 16, 40):
                assert min_hits(fast.access_log, capacity) == min_hits(plain.access_log, capacity)
        fast.check_integrity()
    assert below > 40  # chunk commits went below a lease
    assert fast.access_log.produced == plain.access_log.produced
    for capacity in (0, 8, 24, 80):
        assert min_hits(fast.access_log, capacity) == min_hits(plain.access_log, capacity)
    assert fast.statistics() == plain.statistics()
    assert fast.statistics().evicted_active_blocks > 10  # contested: evictions read the order
    for a, b, _ in running.values():
        fast.release(a)
        plain.release(b)
    assert eviction_order(fast, 20) == eviction_order(plain, 20)
