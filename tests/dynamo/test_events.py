"""KV events from the radix tree's hooks (integrations/dynamo/events.py)."""

from pbkv.integrations.dynamo.events import KvEventRelay, Removed, Stored, block_id
from pbkv.kvmanager import RadixTree, block_keys
from pbkv.kvmanager.policies import lru_priority

BS = 2


def make(gpu=8, host=0):
    tree = RadixTree(
        block_size=BS,
        gpu_capacity_blocks=gpu,
        host_capacity_blocks=host,
        priority=lru_priority,
        clock=lambda: 0.0,
    )
    calls = []
    tree.hooks.on_insert = lambda leaf: calls.append(("insert", tuple(leaf.keys)))
    return tree, KvEventRelay(tree), calls


def put(tree, tokens):
    keys = block_keys(tokens, BS)
    match = tree.match_prefix(keys)
    new = len(keys) - match.gpu_blocks - match.host_blocks
    tree.insert(keys, tree.allocate_private("gpu", new))
    return keys


def ids(keys):
    return tuple(block_id(k) for k in keys)


def test_block_id_is_a_non_negative_signed_64_bit_int():
    key = (1 << 127) | (1 << 63) | 5
    assert block_id(key) == 5
    assert 0 <= block_id(2**128 - 1) < 2**63


def test_an_insert_is_published_once_its_tokens_are_known_and_inner_hooks_still_run():
    tree, relay, calls = make()
    keys = put(tree, [1, 2, 3, 4])
    assert calls == [("insert", tuple(keys))]
    assert relay.drain() == []  # tokens not known yet
    relay.learn([1, 2, 3, 4, 5])  # a partial block has no key
    assert relay.drain() == [Stored((1, 2, 3, 4), ids(keys), None, BS)]
    relay.learn([1, 2, 3, 4])
    assert relay.drain() == []  # published once


def test_an_extension_names_its_parent_block():
    tree, relay, _ = make()
    first = put(tree, [1, 2])
    relay.learn([1, 2])
    keys = put(tree, [1, 2, 7, 8])
    relay.learn([1, 2, 7, 8])
    assert relay.drain() == [
        Stored((1, 2), ids(first), None, BS),
        Stored((7, 8), ids(keys[1:]), block_id(first[0]), BS),
    ]


def test_a_pending_node_split_before_publishing_publishes_both_parts_in_order():
    tree, relay, _ = make()
    keys = put(tree, [1, 2, 3, 4])
    tree.match_prefix(block_keys([1, 2, 9, 9], BS))  # splits the node after one block
    relay.learn([1, 2, 3, 4])
    assert relay.drain() == [
        Stored((1, 2), ids(keys[:1]), None, BS),
        Stored((3, 4), ids(keys[1:]), block_id(keys[0]), BS),
    ]


def test_a_dropped_block_is_removed_and_a_demoted_one_only_when_the_host_drops_it():
    tree, relay, _ = make(gpu=2, host=2)
    keys = put(tree, [1, 2, 3, 4])
    relay.learn([1, 2, 3, 4])
    relay.drain()
    tree.evict("gpu", 2)  # demoted: still matchable on the host
    assert relay.drain() == []
    tree.evict("host", 2)
    assert relay.drain() == [Removed(ids(keys))]
    assert relay.published_blocks() == 0


def test_a_node_dropped_before_publishing_is_never_published():
    tree, relay, _ = make(gpu=2)
    put(tree, [1, 2, 3, 4])
    tree.evict("gpu", 2)
    relay.learn([1, 2, 3, 4])
    assert relay.drain() == []


def test_a_prompt_learned_first_is_published_at_insertion_and_each_batch_is_notified():
    tree, relay, _ = make()
    notified = []
    relay.on_events = lambda: notified.append(len(relay.drain()))
    relay.learn([1, 2, 3, 4])
    put(tree, [1, 2, 3, 4])
    assert notified == [1]


def test_forget_drops_tokens_no_request_holds_so_a_later_insert_waits():
    tree, relay, _ = make()
    relay.learn([1, 2])
    relay.learn([1, 2, 3, 4])
    relay.forget([1, 2])
    relay.forget([1, 2, 3, 4])
    put(tree, [1, 2, 3, 4])
    assert relay.drain() == []
    relay.learn([1, 2, 3, 4])
    assert [type(e) for e in relay.drain()] == [Stored]
