"""Radix tree: matching, splitting, leases, tiers and the §5.1 invariants."""

import pytest

from pbkv.kvmanager import RadixTree
from pbkv.kvmanager.policies import lru_priority


def make_tree(clock, gpu=8, host=8):
    return RadixTree(
        block_size=1,
        gpu_capacity_blocks=gpu,
        host_capacity_blocks=host,
        priority=lru_priority,
        clock=clock,
    )


def put(tree, keys):
    blocks = tree.allocate_private("gpu", len(keys))
    return tree.insert(keys, blocks)


def test_match_splits_and_counts_tiers(clock):
    tree = make_tree(clock)
    put(tree, [1, 2, 3, 4])
    m = tree.match_prefix([1, 2, 9])
    assert (m.gpu_blocks, m.host_blocks) == (2, 0)
    assert [n.keys for n in m.path] == [[1, 2]]
    assert [n.keys for n in tree.nodes()] in ([[1, 2], [3, 4]], [[3, 4], [1, 2]])
    tree.check_integrity()


def test_insert_frees_duplicates_and_adds_leaf(clock):
    tree = make_tree(clock)
    put(tree, [1, 2])
    m = put(tree, [1, 2, 3])
    assert m.gpu_blocks == 3
    assert tree.cached_blocks("gpu") == 3
    assert tree.gpu.num_free == 5
    tree.check_integrity()


def test_insert_skip_requires_cached_prefix(clock):
    tree = make_tree(clock)
    with pytest.raises(ValueError, match="not cached"):
        tree.insert([1, 2, 3], tree.allocate_private("gpu", 1))


def test_lease_blocks_eviction_and_counts(clock):
    tree = make_tree(clock)
    m = put(tree, [1, 2, 3])
    lease = tree.lock(m.node)
    assert tree.evict("gpu", 3) == 0
    tree.check_integrity()
    tree.unlock(lease)
    with pytest.raises(ValueError):
        tree.unlock(lease)
    assert tree.evict("gpu", 3) == 3
    tree.check_integrity()


def test_gpu_eviction_demotes_to_host_and_match_sees_host(clock):
    tree = make_tree(clock)
    put(tree, [1, 2, 3, 4])
    assert tree.evict("gpu", 2) == 2
    m = tree.match_prefix([1, 2, 3, 4])
    assert (m.gpu_blocks, m.host_blocks) == (2, 2)
    assert tree.counters.demoted_blocks == 2 and tree.counters.d2h_blocks == 2
    tree.check_integrity()


def test_without_host_tier_eviction_drops(clock):
    tree = make_tree(clock, host=0)
    put(tree, [1, 2, 3, 4])
    tree.evict("gpu", 4)
    assert tree.nodes() == []
    assert tree.counters.dropped_blocks == 4
    tree.check_integrity()


def test_dropping_a_parent_removes_host_children_no_gap(clock):
    tree = make_tree(clock, gpu=8, host=2)
    put(tree, [1, 2])
    clock.advance()
    put(tree, [1, 2, 3, 4])  # child [3,4], both touched at t=1
    tree.evict("gpu", 2)  # child [3,4] demoted to host: host now full
    clock.advance()
    put(tree, [7, 8])
    # parent [1,2] is next; the host's only entry ranks no lower, so no host room is
    # taken from it: the parent is dropped, and its host-only child with it
    tree.evict("gpu", 2)
    m = tree.match_prefix([1, 2, 3, 4])
    assert (m.gpu_blocks, m.host_blocks) == (0, 0)
    assert [n.keys for n in tree.nodes()] == [[7, 8]]
    assert tree.counters.dropped_blocks == 4
    tree.check_integrity()


def test_demotion_takes_host_room_only_from_lower_ranked_cache(clock):
    tree = make_tree(clock, gpu=8, host=2)
    put(tree, [1, 2])
    tree.evict("gpu", 2)  # [1,2] on host, last used t=0
    clock.advance()
    put(tree, [5, 6])
    tree.evict("gpu", 2)  # [5,6] (t=1) outranks [1,2] (t=0) under LRU: [1,2] makes room
    assert tree.match_prefix([5, 6]).host_blocks == 2
    assert tree.match_prefix([1, 2]).host_blocks == 0
    tree.check_integrity()


def test_host_leaf_rule(clock):
    tree = make_tree(clock, gpu=8, host=8)
    put(tree, [1, 2, 3, 4])
    tree.evict("gpu", 4)  # all on host: [1,2,3,4] one node
    tree.match_prefix([1, 2])  # split: [1,2] -> [3,4]
    assert tree.evict("host", 2) == 2
    remaining = tree.nodes()
    assert [n.keys for n in remaining] == [[1, 2]]
    tree.check_integrity()


def test_load_success_and_failure(clock):
    tree = make_tree(clock)
    put(tree, [1, 2, 3])
    tree.evict("gpu", 3)
    m = tree.match_prefix([1, 2, 3])
    load = tree.begin_load(list(m.host_nodes))
    assert all(n.loading for n in m.host_nodes)
    assert tree.evict("host", 3) == 0  # leased during the copy
    tree.check_integrity()
    tree.complete_load(load, ok=False)
    assert tree.match_prefix([1, 2, 3]).gpu_blocks == 0
    tree.check_integrity()
    load = tree.begin_load(list(tree.match_prefix([1, 2, 3]).host_nodes))
    tree.complete_load(load, ok=True)
    assert tree.match_prefix([1, 2, 3]).gpu_blocks == 3
    tree.check_integrity()


def test_namespaces_never_share(clock):
    tree = make_tree(clock)
    blocks = tree.allocate_private("gpu", 2)
    tree.insert([1, 2], blocks, namespace="a")
    assert tree.match_prefix([1, 2], namespace="b").gpu_blocks == 0
    assert tree.match_prefix([1, 2], namespace="a").gpu_blocks == 2


def test_integrity_reports_numbers(clock):
    tree = make_tree(clock)
    put(tree, [1, 2])
    tree._private["gpu"] += 1
    with pytest.raises(AssertionError, match="capacity 8"):
        tree.check_integrity()


def test_block_pool_is_lazy_and_reuses_returned_ids_first():
    from pbkv.kvmanager import BlockPool

    pool = BlockPool(10**15)  # a list of every id would not fit in memory
    assert pool.num_free == 10**15
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([1, 2])
    assert pool.num_free == 10**15 - 1
    assert pool.allocate(3) == [1, 2, 3]
    assert not pool.can_allocate(10**15)
    small = BlockPool(2)
    assert small.allocate(2) == [0, 1] and small.num_free == 0
    with pytest.raises(ValueError, match="cannot allocate 1 blocks: 0 free"):
        small.allocate(1)


def test_leased_blocks_is_kept_through_locks_loads_and_splits(clock):
    tree = make_tree(clock)
    put(tree, [1, 2, 3])
    tree.evict("gpu", 3)  # host only: [1, 2, 3]
    held = tree.lock(tree.match_prefix([1, 2, 3]).node)
    assert (tree.leased_blocks("gpu"), tree.leased_blocks("host")) == (0, 3)
    load = tree.begin_load(list(tree.match_prefix([1, 2, 3]).host_nodes))
    tree.complete_load(load, ok=True)  # lands on a node the request still leases
    assert (tree.leased_blocks("gpu"), tree.leased_blocks("host")) == (3, 3)
    tree.match_prefix([1, 9])  # splits the leased node: [1] -> [2, 3], both leased
    assert (tree.leased_blocks("gpu"), tree.leased_blocks("host")) == (3, 3)
    other = tree.lock(tree.match_prefix([1]).node)  # a second lease on part of the path
    tree.unlock(held)
    assert (tree.leased_blocks("gpu"), tree.leased_blocks("host")) == (1, 1)
    tree.unlock(other)
    assert (tree.leased_blocks("gpu"), tree.leased_blocks("host")) == (0, 0)
    tree.check_integrity()  # the running count agrees with a walk over the leases
