"""The fake 1.2 block manager: one test per rule, each naming the upstream file it mirrors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pbkv.engines.trtllm.api import KvCacheRetentionConfig
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


def manager(gpu: int = 16, host: int = 0, ring: int = 1024, clock=None) -> FakeBlockManager:
    config = BlockManagerConfig(
        tokens_per_block=BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring
    )
    return FakeBlockManager(config, clock or Clock())


_ids = iter(range(1, 1 << 30))


def serve(m: FakeBlockManager, prompt, new=1, retention=None, salt=""):
    rid = next(_ids)
    m.add_sequence(rid, prompt, new, retention, salt)
    m.store_context_blocks(rid)
    for _ in range(new):
        m.add_token(rid, 7)
    metrics = m.remove_sequence(rid)
    m.check_integrity()
    return metrics


def prio(p: int, duration_s: float | None = None) -> KvCacheRetentionConfig:
    d = None if duration_s is None else timedelta(seconds=duration_s)
    return KvCacheRetentionConfig([Range(0, None, p, d)])


def prompt(base: int, n: int = 9) -> list[int]:
    """A 9-token prompt: 2 reusable blocks (the last token is never reused)."""
    return [base + i for i in range(n)]


def data(events, kind):
    return [e["data"] for e in events if e["data"]["type"] == kind]


def hashes_of(p, salt=""):
    return prompt_block_hashes(p, BS, salt)


def test_created_event_reports_blocks_per_level():
    """kvCacheEventManager.cpp / kvCacheManager.cpp: one ``created`` event at construction."""
    events = manager(gpu=16, host=8).get_latest_events()
    assert events == [
        {
            "event_id": 0,
            "data": {"type": "created", "num_blocks_per_cache_level": [16, 8]},
            "window_size": BlockManagerConfig().window_size,
        }
    ]


def test_last_prompt_token_is_never_reused():
    """kvCacheManager.cpp::addSequence: block keys leave out the last prompt token."""
    m = manager()
    serve(m, list(range(8)))  # two full blocks stored
    again = serve(m, list(range(8)))
    assert again.num_reused_blocks == 1  # 7 usable tokens: one full block
    longer = serve(m, list(range(9)))
    assert longer.num_reused_blocks == 2


def test_eviction_is_strict_priority_then_lru():
    """evictionPolicy.cpp (LRUEvictionPolicy): lowest priority queue first, LRU inside."""
    m = manager(gpu=7)
    a, b, c = prompt(100), prompt(200), prompt(300)
    serve(m, a, retention=prio(50))
    serve(m, b)  # priority 35
    serve(m, c)  # priority 35, released after b
    m.get_latest_events()
    serve(m, prompt(400, 13))  # needs 4 blocks: 1 free
    removed = [h for d in data(m.get_latest_events(), "removed") for h in d["block_hashes"]]
    hb, hc = hashes_of(b), hashes_of(c)
    assert removed == [hb[1], hb[0], hc[1]]  # b (older) before c; a (50) untouched


def test_only_leaves_are_evicted():
    """evictionPolicy.cpp / docs: a parent released before its child still goes after it."""
    m = manager(gpu=4)
    a = prompt(100)
    serve(m, a)
    m.get_latest_events()
    serve(m, prompt(500, 5))  # needs 2 blocks, 2 free
    serve(m, prompt(600, 9))  # needs 3: evicts 2 leaves first
    removed = [h for d in data(m.get_latest_events(), "removed") for h in d["block_hashes"]]
    ha = hashes_of(a)
    assert removed.index(ha[1]) < removed.index(ha[0])


def test_offload_at_priority_30_or_more_when_host_has_room():
    """WindowBlockManager::getFreeBlock (kvCacheManager.cpp): canOffload = priority >= 30."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a, retention=prio(30))
    m.get_latest_events()
    serve(m, prompt(200))
    ha = hashes_of(a)
    updates = data(m.get_latest_events(), "updated")
    assert [(u["block_hash"], u["cache_level"]["new_value"]) for u in updates] == [
        (ha[1], HOST),
        (ha[0], HOST),
    ]
    assert m.lookup(ha[0]).level == HOST and m.lookup(ha[0]).priority == 30
    assert m.counters.offloaded_blocks == 2


def test_below_30_drops_and_a_dropped_parent_takes_its_subtree():
    """evictionPolicy.cpp / kvCacheManager.cpp::freeChildren: drop removes descendants,
    even those on host."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a, retention=KvCacheRetentionConfig([Range(0, BS, 10), Range(BS, None, 35)]))
    m.get_latest_events()
    serve(m, prompt(200))  # a[1] (35, the only leaf) is offloaded; a[0] (10) is dropped
    events = m.get_latest_events()
    ha = hashes_of(a)
    assert [u["block_hash"] for u in data(events, "updated")] == [ha[1]]
    assert data(events, "removed") == [{"type": "removed", "block_hashes": [ha[0], ha[1]]}]
    assert m.lookup(ha[1]) is None and m.free_blocks(HOST) == 4


def test_host_hit_onboards():
    """kvCacheManager.cpp::loadOrAllocateBlocks: a host match is onboarded (updated 1 -> 0)."""
    m = manager(gpu=3, host=4)
    a = prompt(100)
    serve(m, a)
    serve(m, prompt(200))  # offloads a
    m.get_latest_events()
    metrics = serve(m, a)
    assert metrics.num_reused_blocks == 2
    updates = [u for u in data(m.get_latest_events(), "updated") if u["cache_level"]]
    onboarded = [u["block_hash"] for u in updates if u["cache_level"]["new_value"] == GPU]
    assert onboarded == hashes_of(a)
    assert m.counters.onboarded_blocks == 2


def test_latest_claim_wins_and_a_plain_claim_replaces_the_duration():
    """evictionPolicy.cpp: "New priority values always override the previous value"; a
    claim without a priority keeps it but replaces the duration."""
    m = manager()
    a = prompt(100)
    serve(m, a, retention=prio(50))
    m.get_latest_events()
    serve(m, a, retention=prio(80, duration_s=5))
    diffs = [u["priority"] for u in data(m.get_latest_events(), "updated")]
    assert diffs == [{"type": "event_diff", "old_value": 50, "new_value": 80}] * 2
    serve(m, a)
    block = m.lookup(hashes_of(a)[0])
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
    a = prompt(100)
    serve(m, a, retention=prio(80, duration_s=10))
    clock.t = 8.0
    serve(m, a, retention=prio(80, duration_s=10))  # released again at t=8
    clock.t = 11.0
    m.refresh()
    assert m.lookup(hashes_of(a)[0]).priority == 80
    clock.t = 18.5
    m.refresh()
    assert m.lookup(hashes_of(a)[0]).priority == 35


def test_decode_blocks_are_stored_at_the_end_with_the_decode_priority():
    """kvCacheManager.cpp::storeBlocksForReuse: generated tokens' blocks, decode priority."""
    m = manager()
    p = prompt(100, 8)
    rid = next(_ids)
    m.add_sequence(rid, p, 4, KvCacheRetentionConfig([Range(0, None, 60)], 20))
    m.store_context_blocks(rid)
    for t in range(4):
        m.add_token(rid, 900 + t)
    stored_before = data(m.get_latest_events(), "stored")
    m.remove_sequence(rid)
    stored_after = data(m.get_latest_events(), "stored")
    assert [b["priority"] for d in stored_before for b in d["blocks"]] == [60, 60]
    assert [b["priority"] for d in stored_after for b in d["blocks"]] == [20]
    assert stored_after[0]["parent_hash"] == stored_before[0]["blocks"][-1]["block_hash"]


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


def test_perf_metrics_count_reused_and_missed_blocks():
    """executor result perf metrics: kv_cache_metrics (reused / missed / hit rate)."""
    m = manager()
    first = serve(m, prompt(100, 13))
    second = serve(m, prompt(100, 13))
    assert (first.num_reused_blocks, first.num_missed_blocks) == (0, 4)
    assert (second.num_reused_blocks, second.num_missed_blocks) == (3, 1)
    assert second.kv_cache_hit_rate == pytest.approx(0.75)


def test_cache_salt_isolates_tenants():
    """BlockKeyHasher: the cache salt is mixed into the block hash."""
    m = manager()
    serve(m, prompt(100), salt="alice")
    assert serve(m, prompt(100), salt="bob").num_reused_blocks == 0
    assert serve(m, prompt(100), salt="alice").num_reused_blocks == 2
