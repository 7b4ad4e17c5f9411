"""The host-tier models (issue 34): ``exclusive`` (TensorRT-LLM's offload on eviction) and
``write-through`` (SGLang HiCache's default, ``hiradix_cache.py``)."""

import pytest

from pbkv.kvmanager import RadixTree
from pbkv.kvmanager.policies import lru_priority


def make_tree(clock, host_tier, gpu=4, host=8):
    return RadixTree(
        block_size=1,
        gpu_capacity_blocks=gpu,
        host_capacity_blocks=host,
        priority=lru_priority,
        clock=clock,
        host_tier=host_tier,
    )


def put(tree, keys, clock):
    clock.advance(1.0)
    return tree.insert(keys, tree.allocate_private("gpu", len(keys)))


def test_write_through_gives_every_stored_block_a_host_copy(clock):
    tree = make_tree(clock, "write-through")
    copied = []
    tree.hooks.on_demote = lambda node, gpu, host: copied.append((list(gpu), list(host)))
    put(tree, [1, 2], clock)
    [node] = tree.nodes()
    assert node.on_gpu and node.on_host
    assert tree.cached_blocks("gpu") == tree.cached_blocks("host") == 2
    assert copied == [(node.gpu_blocks, node.host_blocks)]  # the engine copies it now
    assert tree.counters.written_through_blocks == tree.counters.d2h_blocks == 2
    tree.check_integrity()


def test_write_through_gpu_eviction_keeps_the_copy_matchable_without_a_transfer(clock):
    tree = make_tree(clock, "write-through")
    put(tree, [1, 2], clock)
    assert tree.evict("gpu", 2) == 2
    m = tree.match_prefix([1, 2])
    assert (m.gpu_blocks, m.host_blocks) == (0, 2)
    assert tree.counters.d2h_blocks == 2  # written once, at store time; eviction copied nothing
    assert tree.counters.demoted_blocks == 2
    tree.check_integrity()


def test_write_through_host_capacity_counts_copies_and_evicts_only_host_only_blocks(clock):
    tree = make_tree(clock, "write-through", gpu=4, host=4)
    put(tree, [1, 2], clock)
    put(tree, [7, 8], clock)  # the host is full of copies of GPU-resident blocks
    assert tree.host.num_free == 0
    assert tree.evict("host", 2) == 0  # a copy of a block still on the GPU never leaves
    tree.evict("gpu", 2)  # [1, 2] (least recently used) is host-only now
    put(tree, [5, 6], clock)  # its write-through takes the host-only [1, 2]'s room
    assert tree.match_prefix([1, 2]).host_blocks == 0
    assert tree.match_prefix([5, 6]).node.on_host
    tree.check_integrity()


def test_write_through_drops_a_block_the_host_had_no_room_to_copy(clock):
    tree = make_tree(clock, "write-through", gpu=4, host=2)
    put(tree, [1, 2], clock)
    put(tree, [7, 8], clock)  # no room for its copy: [1, 2]'s is on the GPU too
    assert not tree.match_prefix([7, 8]).node.on_host
    tree.evict("gpu", 4)
    assert tree.match_prefix([7, 8]).host_blocks == 0  # dropped, never copied at eviction
    assert tree.match_prefix([1, 2]).host_blocks == 2
    assert tree.counters.d2h_blocks == 2
    tree.check_integrity()


def test_write_through_copies_a_new_block_even_over_host_cache_ranked_above_it(clock):
    # HiCache writes every new block through and the host pool evicts by its own order: a
    # copy refused at store time would be lost for good once the GPU lets the block go
    tree = RadixTree(
        block_size=1,
        gpu_capacity_blocks=4,
        host_capacity_blocks=2,
        priority=lambda node: (node.keys[0],),  # a block's first key is its rank
        clock=clock,
        host_tier="write-through",
    )
    put(tree, [9, 10], clock)
    tree.evict("gpu", 2)  # host-only now, ranked above the next block
    put(tree, [1, 2], clock)
    assert tree.match_prefix([1, 2]).node.on_host
    assert tree.match_prefix([9, 10]).host_blocks == 0
    assert tree.counters.written_through_blocks == 4
    tree.check_integrity()


def test_exclusive_copies_to_the_host_only_on_gpu_eviction(clock):
    tree = make_tree(clock, "exclusive")
    put(tree, [1, 2], clock)
    assert tree.cached_blocks("host") == 0 and tree.counters.d2h_blocks == 0
    tree.evict("gpu", 2)
    assert tree.match_prefix([1, 2]).host_blocks == 2
    assert tree.counters.d2h_blocks == 2
    tree.check_integrity()


def test_an_unknown_host_tier_is_refused(clock):
    with pytest.raises(ValueError, match="unknown host tier 'write-back'; known: exclusive"):
        make_tree(clock, "write-back")
