"""The event mirror: it follows the fake's tree, detects gaps, and resynchronises."""

from __future__ import annotations

import pytest

from pbkv.engines.trtllm.fake import HOST, BlockManagerConfig, FakeBlockManager, prompt_block_hashes
from pbkv.engines.trtllm.mirror import Mirror

BS = 4


def serve(m: FakeBlockManager, rid: int, prompt: list[int]) -> int:
    m.add_sequence(rid, prompt, 1)
    m.store_context_blocks(rid)
    m.add_token(rid, 7)
    return m.remove_sequence(rid).num_reused_blocks


def fake(gpu=3, host=4, ring=1024, **kw) -> FakeBlockManager:
    return FakeBlockManager(
        BlockManagerConfig(BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring, **kw),
        lambda: 0.0,
    )


def test_mirror_follows_store_offload_and_onboard():
    m, mirror = fake(), Mirror()
    a = list(range(100, 109))
    serve(m, 1, a)
    serve(m, 2, list(range(200, 209)))  # a is offloaded
    mirror.apply_all(m.get_latest_events())
    ha = prompt_block_hashes(a, BS)
    assert mirror.num_blocks_per_level == (3, 4)
    assert [mirror.blocks[h].level for h in ha] == [HOST, HOST]
    assert mirror.blocks[ha[1]].parent is mirror.blocks[ha[0]]
    assert mirror.blocks[ha[0]].tokens == (100, 101, 102, 103)
    serve(m, 3, a)  # onboarded
    mirror.apply_all(m.get_latest_events())
    assert [mirror.blocks[h].level for h in ha] == [0, 0]
    assert mirror.statistics().gaps == 0


def test_a_removed_parent_takes_its_subtree_from_the_mirror():
    mirror = Mirror()
    blocks = [
        {"type": "stored_block", "block_hash": h, "tokens": [], "cache_level": 0, "priority": 35}
        for h in (1, 2, 3)
    ]
    mirror.apply({"event_id": 0, "data": {"type": "stored", "parent_hash": None, "blocks": blocks}})
    mirror.apply({"event_id": 1, "data": {"type": "removed", "block_hashes": [2]}})
    assert set(mirror.blocks) == {1}
    assert mirror.statistics().unknown_refs == 0


def stored(event_id: int, parent, *hashes: int) -> dict:
    blocks = [
        {"type": "stored_block", "block_hash": h, "tokens": [], "cache_level": 0, "priority": 35}
        for h in hashes
    ]
    data = {"type": "stored", "parent_hash": parent, "blocks": blocks}
    return {"event_id": event_id, "data": data, "window_size": 1}


def updated(event_id: int, h: int, new_priority: int) -> dict:
    diff = {"type": "event_diff", "old_value": 35, "new_value": new_priority}
    data = {"type": "updated", "block_hash": h, "cache_level": None, "priority": diff}
    return {"event_id": event_id, "data": data, "window_size": 1}


def test_an_event_id_gap_marks_the_mirror_stale_until_resynchronised():
    mirror = Mirror(resync_events=3)
    mirror.apply(stored(0, None, 1, 2))
    mirror.apply(stored(4, None, 3))  # events 1..3 lost: block 2 may be gone
    stats = mirror.statistics()
    assert mirror.stale and (stats.gaps, stats.lost_events) == (1, 3)
    assert not mirror.blocks[1].confirmed and mirror.blocks[3].confirmed
    mirror.apply(updated(5, 1, 80))  # block 1 shows up again
    assert mirror.stale
    mirror.apply(updated(6, 3, 90))  # third event from the gap on: resync ends
    assert not mirror.stale and mirror.statistics().resyncs == 1
    assert set(mirror.blocks) == {1, 3} and mirror.statistics().ghosts_dropped == 1
    assert mirror.blocks[1].priority == 80


def test_ring_overflow_in_the_fake_is_seen_as_a_gap():
    m, mirror = fake(gpu=64, host=0, ring=2), Mirror(tokens_per_block=BS)
    serve(m, 1, list(range(100, 109)))
    mirror.apply_all(m.get_latest_events())
    dropped = m.counters.events_dropped
    for rid, base in enumerate((200, 300, 400), start=2):
        serve(m, rid, list(range(base, base + 9)))
        m.flush_iteration_events()  # one iteration per request: 2 events each, ring of 2
    mirror.apply_all(m.get_latest_events())
    assert m.counters.events_dropped - dropped == 4
    assert mirror.stale and mirror.statistics().lost_events == 4


def test_a_finished_request_confirms_its_reused_prefix_and_drops_ghosts():
    mirror = Mirror()
    tokens = [(1, 2, 3, 4), (5, 6, 7, 8)]
    hashes = [11, 12]
    mirror.confirm_prefix(hashes, tokens, reused_blocks=2)
    assert mirror.blocks[12].parent is mirror.blocks[11]
    mirror.apply({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [8, 0]}})
    mirror.apply({"event_id": 5, "data": {"type": "created", "num_blocks_per_cache_level": [8, 0]}})
    assert mirror.stale
    mirror.confirm_prefix(hashes, tokens, reused_blocks=1)  # block 12 was not reused: a ghost
    assert set(mirror.blocks) == {11} and mirror.blocks[11].confirmed


def test_a_malformed_event_is_refused():
    with pytest.raises(ValueError, match="not a KV-cache event"):
        Mirror().apply({"data": {}})
    with pytest.raises(ValueError, match="unknown type"):
        Mirror().apply({"event_id": 0, "data": {"type": "nope"}})


def envelope(event_id: int, data: dict, window: int = 1) -> dict:
    return {"event_id": event_id, "data": data, "window_size": window}


def test_separate_and_merged_updated_events_both_apply():
    """kvCacheManager.cpp::loadOrAllocateBlocks / onboardBlock send a priority change and
    a level change as two events, the other field None; a merged one applies too."""
    mirror = Mirror()
    mirror.apply(stored(0, None, 1, 2))
    diff = {"type": "event_diff", "old_value": 0, "new_value": 1}
    level_only = {"type": "updated", "block_hash": 1, "cache_level": diff, "priority": None}
    mirror.apply(envelope(1, level_only))
    mirror.apply(updated(2, 1, 70))  # priority only
    assert (mirror.blocks[1].level, mirror.blocks[1].priority) == (HOST, 70)
    both = {
        "type": "updated",
        "block_hash": 2,
        "cache_level": diff,
        "priority": {"type": "event_diff", "old_value": 35, "new_value": 20},
    }
    mirror.apply(envelope(3, both))
    assert (mirror.blocks[2].level, mirror.blocks[2].priority) == (HOST, 20)
    assert mirror.count(HOST) == 2 and mirror.statistics().unknown_refs == 0


def test_only_the_largest_attention_window_is_mirrored():
    """kvCacheEventManager.cpp: every window's events on one id counter; Dynamo's
    publisher.py keeps the largest window's."""
    m = FakeBlockManager(
        BlockManagerConfig(BS, gpu_blocks=16, window_size=64, extra_window_sizes=(16,)),
        lambda: 0.0,
    )
    mirror = Mirror(tokens_per_block=BS)
    a = list(range(100, 109))
    serve(m, 1, a)
    mirror.apply_all(m.get_latest_events())
    stats = mirror.statistics()
    assert mirror.window_size == 64 and stats.windows == 2 and stats.gaps == 0
    assert set(mirror.blocks) == set(prompt_block_hashes(a, BS))
    assert stats.other_window_events == 2  # window 16's two stored events


def test_partial_blocks_are_not_mirrored_and_their_events_are_skipped():
    """kvCacheManager.cpp::releaseBlocks stores a trailing partial block; Dynamo's
    publisher.py drops it and its later remove."""
    m, mirror = fake(gpu=3, host=0), Mirror(tokens_per_block=BS)
    a = list(range(100, 110))  # 10 tokens + 1 generated: 4 + 4 + 2 stored
    serve(m, 1, a)
    mirror.apply_all(m.get_latest_events())
    assert set(mirror.blocks) == set(prompt_block_hashes(a, BS))
    serve(m, 2, list(range(200, 209)))  # evicts a's blocks, the partial one first
    mirror.apply_all(m.get_latest_events())
    stats = mirror.statistics()
    assert stats.unknown_refs == 0
    assert stats.partial_block_events == 3  # a's stored and removed, b's stored
    assert not set(mirror.blocks) & set(prompt_block_hashes(a, BS))


def late_removal(late: bool = True):
    """One iteration in which X's admission evicts block h and Y, which computed h's
    tokens on its own, stores it again (Y was admitted before Z stored h)."""
    m = fake(gpu=8, host=0, late_removals=late)
    p = list(range(100, 109))  # 9 tokens: blocks a0, a1 (+ a partial one at the end)
    m.add_sequence(1, p, 1)  # Y: nothing cached yet, its own blocks
    serve(m, 2, p)  # Z stores a0, a1 and the partial block
    first = m.get_latest_events()  # end of iteration 1
    m.add_sequence(3, list(range(500, 513)), 1)  # X: evicts the partial block, then a1
    m.store_context_blocks(1)  # Y's prefill ends: stores a1 again under Z's a0
    return m, first, m.get_latest_events(), prompt_block_hashes(p, BS)


def test_late_removal_of_a_re_stored_block_keeps_it_as_a_suspect():
    """kvCacheEventManager.cpp (1.2.x): ``removed(h)`` may follow the re-store of ``h`` in
    one iteration (fixed on main by PR #11883): the mirror keeps h, doubting it."""
    m, first, second, (a0, a1) = late_removal()
    mirror = Mirror(tokens_per_block=BS)
    mirror.apply_all(first)
    mirror.apply_all(second)
    assert m.lookup(a1) is not None and a1 in mirror.blocks
    assert not mirror.blocks[a1].confirmed and mirror.statistics().late_removals == 1
    mark = mirror.events_applied
    mirror.confirm_prefix([a0, a1], [(), ()], reused_blocks=2, submitted_mark=mark)
    assert mirror.blocks[a1].confirmed  # a request reused it: it is there


def test_a_suspect_is_dropped_when_a_later_request_stops_right_before_it():
    m, first, second, (a0, a1) = late_removal()
    mirror = Mirror(tokens_per_block=BS)
    mirror.apply_all(first)
    early = mirror.events_applied  # a request submitted before the doubt: no evidence
    mirror.apply_all(second)
    mirror.confirm_prefix([a0, a1], [(), ()], reused_blocks=1, submitted_mark=early)
    assert a1 in mirror.blocks
    mirror.confirm_prefix([a0, a1], [(), ()], 1, submitted_mark=mirror.events_applied)
    assert a1 not in mirror.blocks and mirror.statistics().ghosts_dropped == 1


def test_removes_ordered_first_need_no_doubt():
    """main's order (PR #11883): the remove comes before the re-store."""
    m, first, second, (a0, a1) = late_removal(late=False)
    mirror = Mirror(tokens_per_block=BS)
    mirror.apply_all(first)
    mirror.apply_all(second)
    assert mirror.blocks[a1].confirmed and mirror.statistics().late_removals == 0


def test_a_remove_in_a_later_batch_still_applies():
    mirror = Mirror()
    mirror.apply_all([stored(0, None, 1)])
    mirror.apply_all([{"event_id": 1, "data": {"type": "removed", "block_hashes": [1]}}])
    assert mirror.blocks == {} and mirror.statistics().late_removals == 0


def test_a_malformed_event_in_a_batch_is_skipped_and_counted():
    """tensorrt_llm/_utils.py::KVCacheEventSerializer.to_json_str turns None into {}."""
    mirror = Mirror()
    assert mirror.apply_all([stored(0, None, 1), {}, stored(1, 1, 2)]) == 2
    assert set(mirror.blocks) == {1, 2} and mirror.statistics().malformed_events == 1
