"""The fake 1.2 block manager: one test per rule, each naming the upstream file it mirrors
(``cpp/tensorrt_llm/batch_manager/`` unless said otherwise)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pbkv.engines.trtllm.api import KvCacheRetentionConfig
from pbkv.engines.trtllm.blockkey import block_key_hash, cache_salt_id
from pbkv.engines.trtllm.fake import (
    GPU,
    HOST,
    BlockManagerConfig,
    FakeBlockManager,
    per_block_retention,
    prompt_block_hashes,
)

Range = KvCacheRetentionConfig.TokenRangeRetentionConfig
BS = 4


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def manager(gpu: int = 16, host: int = 0, ring: int = 1024, clock=None, **kw) -> FakeBlockManager:
    config = BlockManagerConfig(
        tokens_per_block=BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring, **kw
    )
    return FakeBlockManager(config, clock or Clock())


_ids = iter(range(1, 1 << 30))


def serve(m: FakeBlockManager, prompt, new=1, retention=None, salt=""):
    rid = next(_ids)
    seq = m.add_sequence(rid, prompt, new, retention, salt)
    m.store_context_blocks(rid)
    for _ in range(new):
        m.add_token(rid, 7)
    metrics = m.remove_sequence(rid)
    m.check_integrity()
    serve.cached_tokens = seq.cached_tokens
    return metrics


def prio(p: int, duration_s: float | None = None) -> KvCacheRetentionConfig:
    d = None if duration_s is None else timedelta(seconds=duration_s)
    return KvCacheRetentionConfig([Range(0, None, p, d)])


def prompt(base: int, n: int = 8) -> list[int]:
    """An 8-token prompt: with one generated token, two full blocks are stored."""
    return [base + i for i in range(n)]


def data(events, kind):
    return [e["data"] for e in events if e["data"]["type"] == kind]


def removed(events) -> list[int]:
    return [h for d in data(events, "removed") for h in d["block_hashes"]]


def hashes_of(p, salt=""):
    """Hashes of the full blocks ``serve`` stores for prompt ``p`` (its tokens + one)."""
    return prompt_block_hashes([*p, 0], BS, salt)


def test_created_event_per_attention_window():
    """kvCacheEventManager.cpp::enqueueCreatedEvent: one per window, ascending."""
    events = manager(gpu=16, host=8, window_size=64, extra_window_sizes=(16,)).get_latest_events()
    assert events == [
        {
            "event_id": i,
            "data": {"type": "created", "num_blocks_per_cache_level": [16, 8]},
            "window_size": w,
        }
        for i, w in enumerate((16, 64))
    ]


def test_block_hashes_are_the_engines_with_the_salt_in_the_first_block():
    """kvCacheManager.cpp::BlockKeyHasher::hash via storeBlocks: hashes chain from 0 at
    the root, the salt id mixed into the first block only."""
    m = manager()
    p = prompt(100)
    serve(m, p, salt="tenant")
    salt = cache_salt_id("tenant")
    first = block_key_hash(p[:4], 0, salt)
    second = block_key_hash(p[4:], first, salt)
    assert m.lookup(first) is not None and m.lookup(second) is not None
    assert second == block_key_hash(p[4:], first)  # the salt enters the first block only
    assert hashes_of(p, "tenant") == [first, second]


def test_last_prompt_token_is_never_reused():
    """kvCacheManager.cpp::addSequence: keys leave out the last prompt token; without
    partial reuse the trailing 3 tokens of an 8-token prompt match nothing."""
    m = manager(enable_partial_reuse=False)
    serve(m, list(range(8)))  # two full blocks stored
    assert serve(m, list(range(8))).num_reused_blocks == 1  # 7 usable tokens
    assert serve.cached_tokens == 4
    assert serve(m, list(range(9))).num_reused_blocks == 2
    assert serve.cached_tokens == 8


def test_partial_reuse_matches_the_longest_common_prefix_and_counts_its_tokens():
    """kvCacheManager.cpp::loadOrAllocateBlocks / KVCacheBlock::findMatchingBlock: the
    first non-exact key matches a child by common prefix; it counts as a reused block,
    and cached tokens count the tokens matched (prepopulatedPromptLen)."""
    m = manager()
    serve(m, list(range(8)))
    metrics = serve(m, list(range(8)))  # keys [0..3], [4, 5, 6]: 3 of block 2's tokens
    assert (metrics.num_reused_blocks, serve.cached_tokens) == (2, 7)
    assert m.counters.partial_reused_blocks == 1


def test_a_free_leaf_partially_matched_is_taken_out_of_the_tree_without_an_event():
    """kvCacheManager.cpp::loadOrAllocateBlocks → freeLeafBlock: not in use and a leaf,
    the block is made private (no ``removed`` event) and stored again under its new key."""
    m = manager()
    serve(m, list(range(8)))
    old = hashes_of(list(range(8)))[1]
    m.get_latest_events()
    rid = next(_ids)
    m.add_sequence(rid, [0, 1, 2, 3, 4, 5, 99, 98], 1)  # block 2 shares [4, 5]
    assert m.lookup(old) is None
    assert removed(m.get_latest_events()) == []


def test_a_partially_matched_block_in_use_is_copied():
    """kvCacheManager.cpp::loadOrAllocateBlocks: a partial match in use (or not a leaf)
    is copied into a new block; the original stays in the tree."""
    m = manager()
    serve(m, list(range(8)))
    old = hashes_of(list(range(8)))[1]
    holder = next(_ids)
    m.add_sequence(holder, list(range(9)), 1)  # holds both full blocks
    m.add_sequence(next(_ids), [0, 1, 2, 3, 4, 5, 99, 98], 1)
    assert m.lookup(old) is not None and m.lookup(old).ref_count == 1
    m.check_integrity()


def test_the_trailing_partial_block_is_stored_at_the_end():
    """kvCacheManager.cpp::releaseBlocks / storeBlocks: the sequence minus its last token
    is chopped with allowPartial, so a partial last block enters the tree."""
    m = manager()
    serve(m, prompt(100, 9), new=2)  # 11 tokens: 10 usable = 4 + 4 + 2
    blocks = [b for d in data(m.get_latest_events(), "stored") for b in d["blocks"]]
    assert [len(b["tokens"]) for b in blocks] == [4, 4, 2]
    assert [t["token_id"] for t in blocks[-1]["tokens"]] == [108, 7]


def test_a_retag_and_an_onboard_are_separate_updated_events():
    """kvCacheManager.cpp::loadOrAllocateBlocks then onboardBlock: the priority change is
    reported first with ``cache_level`` None, the onboard next with ``priority`` None."""
    m = manager(gpu=3, host=8)
    a = prompt(100)
    serve(m, a)
    serve(m, prompt(200))  # a goes to host
    m.get_latest_events()
    serve(m, [*a, 0], retention=prio(60))
    updates = [u for u in data(m.get_latest_events(), "updated") if u["block_hash"] in hashes_of(a)]
    h0 = hashes_of(a)[0]
    assert updates[:2] == [
        {
            "type": "updated",
            "block_hash": h0,
            "cache_level": None,
            "priority": {"type": "event_diff", "old_value": 35, "new_value": 60},
        },
        {
            "type": "updated",
            "block_hash": h0,
            "cache_level": {"type": "event_diff", "old_value": HOST, "new_value": GPU},
            "priority": None,
        },
    ]


@pytest.mark.parametrize("late", [True, False])
def test_removes_follow_an_iterations_stores_in_1_2(late):
    """kvCacheEventManager.cpp (1.2.x): an iteration's removes are flushed after its other
    events, so ``removed(h)`` can follow the re-store of ``h``; main orders removes first
    (PR #11883)."""
    m = manager(gpu=8, late_removals=late)
    p = prompt(100, 9)
    m.add_sequence(next(_ids), p, 1)  # Y computes p's blocks itself
    y = next(_ids) - 1
    serve(m, p)  # Z stores them first
    m.get_latest_events()
    m.add_sequence(next(_ids), prompt(500, 13), 1)  # X evicts Z's a1 (and the partial)
    m.store_context_blocks(y)  # Y stores a1 again, same hash
    h = hashes_of(p[:-1])[1]
    order = []
    for e in m.get_latest_events():
        d = e["data"]
        if d["type"] == "stored" and h in [x["block_hash"] for x in d["blocks"]]:
            order.append("stored")
        if d["type"] == "removed" and h in d["block_hashes"]:
            order.append("removed")
    assert order == (["stored", "removed"] if late else ["removed", "stored"])
    assert m.lookup(h) is not None


def test_eviction_is_strict_priority_then_lru():
    """evictionPolicy.cpp (LRUEvictionPolicy): lowest priority queue first, LRU inside."""
    m = manager(gpu=7)
    a, b, c = prompt(100), prompt(200), prompt(300)
    serve(m, a, retention=prio(50))
    serve(m, b)  # priority 35
    serve(m, c)  # priority 35, released after b
    m.get_latest_events()
    serve(m, prompt(400, 12))  # needs 4 blocks: 1 free
    hb, hc = hashes_of(b), hashes_of(c)
    assert removed(m.get_latest_events()) == [hb[1], hb[0], hc[1]]  # a (50) kept


def test_only_leaves_are_evicted():
    """evictionPolicy.cpp / docs: a parent released before its child still goes after it."""
    m = manager(gpu=4)
    a = prompt(100)
    serve(m, a)
    m.get_latest_events()
    serve(m, prompt(500, 12))  # needs 4 blocks: 2 free, then a's leaf, then a's root
    ha = hashes_of(a)
    assert removed(m.get_latest_events()) == [ha[1], ha[0]]


def test_offload_at_priority_30_or_more_when_host_has_room():
    """WindowBlockManager::getFreeBlock (kvCacheManager.cpp): canOffload = priority >= 30."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a, retention=prio(30))
    m.get_latest_events()
    serve(m, prompt(200))
    ha = hashes_of(a)
    updates = data(m.get_latest_events(), "updated")
    assert [(u["block_hash"], u["cache_level"]["new_value"], u["priority"]) for u in updates] == [
        (ha[1], HOST, None),
        (ha[0], HOST, None),
    ]
    assert m.lookup(ha[0]).level == HOST and m.lookup(ha[0]).priority == 30
    assert m.counters.offloaded_blocks == 2


def test_below_30_drops_and_a_dropped_parent_takes_its_subtree():
    """evictionPolicy.cpp / kvCacheManager.cpp::freeChildren: drop removes descendants,
    even those on host, children listed first."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a, retention=KvCacheRetentionConfig([Range(0, BS, 10), Range(BS, None, 35)]))
    m.get_latest_events()
    serve(m, prompt(200))  # a[1] (35, the only leaf) is offloaded; a[0] (10) is dropped
    events = m.get_latest_events()
    ha = hashes_of(a)
    assert [u["block_hash"] for u in data(events, "updated")] == [ha[1]]
    assert removed(events) == [ha[1], ha[0]]
    assert m.lookup(ha[1]) is None and m.free_blocks(HOST) == 4


def test_host_hit_onboards():
    """kvCacheManager.cpp::onboardBlock: a host match is onboarded (updated 1 -> 0)."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a)
    serve(m, prompt(200))  # offloads a
    m.get_latest_events()
    metrics = serve(m, [*a, 0])
    assert metrics.num_reused_blocks == 2
    updates = [u for u in data(m.get_latest_events(), "updated") if u["cache_level"]]
    onboarded = [u["block_hash"] for u in updates if u["cache_level"]["new_value"] == GPU]
    assert onboarded == hashes_of(a)
    assert m.counters.onboarded_blocks == 2


def test_latest_claim_wins_and_a_plain_claim_replaces_the_duration():
    """evictionPolicy.cpp: "New priority values always override the previous value"; a
    claim without a priority keeps it but replaces the duration."""
    m = manager(enable_partial_reuse=False)
    a = [*prompt(100), 0]
    serve(m, a, retention=prio(50))
    m.get_latest_events()
    serve(m, a, retention=prio(80, duration_s=5))
    diffs = [u["priority"] for u in data(m.get_latest_events(), "updated")]
    assert diffs == [{"type": "event_diff", "old_value": 50, "new_value": 80}] * 2
    serve(m, a)
    block = m.lookup(hashes_of(a[:-1])[0])
    assert block.priority == 80 and block.duration_s is None
    assert data(m.get_latest_events(), "updated") == []


def test_token_ranges_map_to_blocks_by_first_token():
    """kvCacheRetentionConfig.cpp::getPerBlockRetentionPriorityDuration (its unit test)."""
    cfg = KvCacheRetentionConfig([Range(0, 63, 80), Range(63, 127, 30)])
    assert [p for p, _ in per_block_retention(cfg, 32, 4)] == [80, 80, 30, 30]
    assert per_block_retention(cfg, 32, 5)[4] == (None, None)  # uncovered: default or kept


def test_retention_ranges_must_be_sorted_and_disjoint():
    """nanobind executor/request.cpp: overlapping ranges or an open range before the last
    raise (invalid_argument upstream)."""
    with pytest.raises(ValueError):
        KvCacheRetentionConfig([Range(0, 10, 50), Range(5, 20, 50)])
    with pytest.raises(ValueError):
        KvCacheRetentionConfig([Range(0, None, 50), Range(5, 20, 50)])


def test_duration_counts_from_the_last_release_then_falls_to_35():
    """evictionPolicy.cpp::releaseBlock / refresh: expiry = release time + duration."""
    clock = Clock()
    m = manager(clock=clock)
    a = [*prompt(100), 0]
    serve(m, a, retention=prio(80, duration_s=10))
    clock.t = 8.0
    serve(m, a, retention=prio(80, duration_s=10))  # released again at t=8
    clock.t = 11.0
    m.refresh()
    h = hashes_of(a[:-1])[0]
    assert m.lookup(h).priority == 80
    clock.t = 18.5
    m.refresh()
    assert m.lookup(h).priority == 35


def test_decode_blocks_are_stored_at_the_end_with_the_decode_priority():
    """kvCacheManager.cpp::storeContextBlocks after prefill (full blocks of the prompt
    minus its last token), releaseBlocks at the end (the rest, decode priority)."""
    m = manager()
    p = prompt(100, 9)
    rid = next(_ids)
    m.add_sequence(rid, p, 4, KvCacheRetentionConfig([Range(0, None, 60)], 20))
    m.store_context_blocks(rid)
    for t in range(4):
        m.add_token(rid, 900 + t)
    stored_before = data(m.get_latest_events(), "stored")
    m.remove_sequence(rid)
    stored_after = data(m.get_latest_events(), "stored")
    assert [b["priority"] for d in stored_before for b in d["blocks"]] == [60, 60]
    # 13 tokens, 12 usable: the prompt's third block (a context block, 60) and the fourth
    assert [b["priority"] for d in stored_after for b in d["blocks"]] == [60]
    assert stored_after[0]["parent_hash"] == stored_before[0]["blocks"][-1]["block_hash"]
    m2 = manager()
    rid = next(_ids)
    m2.add_sequence(rid, prompt(100, 8), 6, KvCacheRetentionConfig([Range(0, None, 60)], 20))
    m2.store_context_blocks(rid)
    for t in range(6):
        m2.add_token(rid, 900 + t)
    m2.get_latest_events()
    m2.remove_sequence(rid)
    after = [b["priority"] for d in data(m2.get_latest_events(), "stored") for b in d["blocks"]]
    assert after == [60, 20, 20]  # block 2 (context), block 3 (decode), partial (decode)


def test_events_have_consecutive_ids_and_the_serializer_schema():
    """tensorrt_llm/_utils.py::KVCacheEventSerializer: envelope and ``stored`` block dicts."""
    m = manager()
    serve(m, prompt(100))
    events = m.get_latest_events()
    assert [e["event_id"] for e in events] == list(range(len(events)))
    stored = data(events, "stored")[0]
    assert stored["parent_hash"] is None
    block = stored["blocks"][0]
    assert set(block) == {"type", "block_hash", "tokens", "cache_level", "priority"}
    assert block["tokens"][0] == {"type": "unique_token", "token_id": 100, "token_extra_id": 0}


def test_ring_drops_its_oldest_events_on_overflow():
    """kvCacheEventManager.cpp: at most event_buffer_max_size events; the oldest go."""
    m = manager(ring=3)
    for base in (100, 200, 300, 400):
        serve(m, prompt(base))
    events = m.get_latest_events()
    ids = [e["event_id"] for e in events]
    assert len(events) == 3 and ids == list(range(ids[0], ids[0] + 3)) and ids[0] > 0
    assert m.counters.events_dropped == ids[0]


def test_events_off_records_nothing_and_serves_as_usual():
    """event_buffer_max_size 0: no event manager, so no events (not even ``created``) and
    nothing dropped, while blocks are still reused."""
    m = manager(ring=0)
    serve(m, prompt(100))
    again = serve(m, prompt(100))
    assert m.get_latest_events() == [] and m.pending_events == 0
    assert m.counters.events_dropped == 0 and again.num_reused_blocks > 0


def test_perf_metrics_count_reused_and_missed_blocks_summed_over_windows():
    """KVCacheManager::addSequence: per-request metrics are deltas of the manager
    counters, summed over attention windows (executor result perf metrics)."""
    m = manager(enable_partial_reuse=False)
    first = serve(m, prompt(100, 13))
    second = serve(m, prompt(100, 13))
    assert (first.num_reused_blocks, first.num_missed_blocks) == (0, 4)
    assert (second.num_reused_blocks, second.num_missed_blocks) == (3, 1)
    assert second.kv_cache_hit_rate == pytest.approx(0.75)
    two = manager(enable_partial_reuse=False, window_size=64, extra_window_sizes=(16,))
    serve(two, prompt(100, 13))
    again = serve(two, prompt(100, 13))
    assert (again.num_reused_blocks, again.num_missed_blocks) == (6, 2)
    events = two.get_latest_events()
    assert {e["window_size"] for e in events} == {16, 64}


def test_cache_salt_isolates_tenants():
    """BlockKeyHasher / BlockKey::operator==: the cache salt is part of the first key."""
    m = manager(enable_partial_reuse=False)
    p = [*prompt(100), 0]
    serve(m, p, salt="alice")
    assert serve(m, p, salt="bob").num_reused_blocks == 0
    assert serve(m, p, salt="alice").num_reused_blocks == 2
