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


def fake(gpu=3, host=4, ring=1024) -> FakeBlockManager:
    return FakeBlockManager(
        BlockManagerConfig(BS, gpu_blocks=gpu, host_blocks=host, event_buffer_max_size=ring),
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
    m, mirror = fake(gpu=64, host=0, ring=2), Mirror()
    for rid, base in enumerate((100, 200, 300, 400), start=1):
        serve(m, rid, list(range(base, base + 9)))
        if rid == 1:
            mirror.apply_all(m.get_latest_events())
    mirror.apply_all(m.get_latest_events())
    assert m.counters.events_dropped == 1
    assert mirror.stale and mirror.statistics().lost_events == 1


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
