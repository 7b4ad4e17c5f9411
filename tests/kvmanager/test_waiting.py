"""The queue's prefix index (``kvmanager/waiting.py``): walks are redone exactly where the
tree changed, and ``note_waiting`` sets the same ``queued`` counts as walking every queued
prompt from scratch on every call."""

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from pbkv.kvmanager import AdmitRequest

from .conftest import make_manager
from .test_eviction import run
from .test_radix_stateful import MAX_PROMPT, PROMPTS, KVManagerMachine


def queued(keys):
    return AdmitRequest(keys=keys, prompt_tokens=len(keys), max_new_tokens=1)


def test_counts_each_queued_request_on_every_node_of_its_cached_prefix(clock):
    mgr = make_manager(clock, "pbkv", gpu=16)
    run(mgr, clock, [1, 2, 3])
    run(mgr, clock, [1, 2, 4])  # [1, 2] / [3] and [4]
    a, b, c = queued([1, 2, 3, 9]), queued([1, 2, 4]), queued([7])
    assert mgr.note_waiting([a, b, c]) == 3
    top = mgr.tree.peek_path([1, 2])[0]
    assert [(n.keys, n.queued) for n in mgr.tree.peek_path([1, 2, 3])] == [([1, 2], 2), ([3], 1)]
    assert mgr.tree.peek_path([1, 2, 4])[1].queued == 1
    assert mgr.note_waiting([a, b, c]) == 0  # nothing changed: nothing walked or re-keyed
    assert mgr.note_waiting([b]) == 2  # [1, 2] down to 1, [3] back to 0
    assert (top.queued, mgr.tree.peek_path([1, 2, 3])[1].queued) == (1, 0)


def test_a_request_queued_twice_counts_twice(clock):
    mgr = make_manager(clock, "pbkv", gpu=16)
    run(mgr, clock, [1, 2])
    a = queued([1, 2])
    mgr.note_waiting([a, a])
    assert mgr.tree.peek_path([1, 2])[0].queued == 2
    mgr.note_waiting([a])
    assert mgr.tree.peek_path([1, 2])[0].queued == 1


def test_a_held_request_is_indexed_but_not_counted_until_released(clock):
    mgr = make_manager(clock, "pbkv", gpu=16)
    run(mgr, clock, [1, 2, 3])
    a, b = queued([1, 2, 3, 9]), queued([1, 2, 3, 8])
    prompts = [(a.keys, ""), (b.keys, "")]
    assert mgr.note_queue(prompts, {id(b.keys)}) == 1
    node = mgr.tree.peek_path([1, 2, 3])[0]
    assert node.queued == 1  # b waits behind the cohort: no near use
    assert mgr.queued_cached_blocks(b.keys) == 3  # its walk still answers its prefix
    assert mgr.note_queue(prompts, {id(a.keys), id(b.keys)}) == 1 and node.queued == 0
    assert mgr.note_queue(prompts) == 1 and node.queued == 2  # both released
    mgr.waiting.check_integrity()


def test_a_walk_is_redone_after_a_split_an_insert_under_its_end_or_a_removal(clock):
    mgr = make_manager(clock, "lru", gpu=16, host=0)
    run(mgr, clock, [1, 2, 3])
    a, b = queued([1, 2, 3, 4, 5]), queued([1, 2, 8])
    mgr.note_waiting([a, b])
    assert mgr.waiting.cached_blocks(a.keys) == 3
    assert mgr.waiting.cached_blocks(b.keys) == 2  # ends inside [1, 2, 3]
    run(mgr, clock, [1, 2, 3, 4])  # a child under a's end: a goes further, b is untouched
    assert mgr.waiting.cached_blocks(a.keys) is None
    assert mgr.waiting.cached_blocks(b.keys) == 2
    assert mgr.queued_cached_blocks(a.keys) == 4  # answered from the tree meanwhile
    mgr.note_waiting([a, b])
    assert mgr.waiting.cached_blocks(a.keys) == 4
    mgr.tree.match_prefix([1, 2, 9])  # splits [1, 2, 3] after 2 blocks: both walk through it
    assert mgr.waiting.cached_blocks(a.keys) is None and mgr.waiting.cached_blocks(b.keys) is None
    mgr.note_waiting([a, b])
    assert [n.keys for n in mgr.waiting._walks[id(a.keys)].path] == [[1, 2], [3], [4]]
    assert mgr.tree.evict("gpu", 1) == 1  # drops the leaf [4]
    assert mgr.waiting.cached_blocks(a.keys) is None and mgr.waiting.cached_blocks(b.keys) == 2
    mgr.note_waiting([a, b])
    assert mgr.waiting.cached_blocks(a.keys) == 3
    mgr.check_integrity()


def test_a_demotion_leaves_the_walk_current(clock):
    mgr = make_manager(clock, "lru", gpu=16, host=16)
    run(mgr, clock, [1, 2])
    run(mgr, clock, [1, 2, 3])  # nodes [1, 2] and [3]
    a = queued([1, 2, 3])
    mgr.note_waiting([a])
    mgr.tree.evict("gpu", 1)  # [3] demoted: the walk is unchanged, its tiers are not
    assert mgr.tree.peek_prefix(a.keys) == (2, 1)
    assert mgr.waiting.cached_blocks(a.keys) == 3


def test_requests_that_left_the_queue_are_forgotten(clock):
    mgr = make_manager(clock, "pbkv", gpu=16)
    run(mgr, clock, [1, 2])
    a = queued([1, 2])
    mgr.note_waiting([a])
    mgr.note_waiting([])
    assert len(mgr.waiting) == 0 and mgr.waiting.counts == {}
    assert mgr.tree.peek_path([1, 2])[0].queued == 0
    mgr.check_integrity()


class WaitingMachine(KVManagerMachine):
    """The KV manager machine with a queue beside it: every ``note_waiting`` must set the
    counts the from-scratch walk gives, and the index must stay current in between."""

    def __init__(self):
        super().__init__()
        self.queue: list[AdmitRequest] = []
        self.counted: Counter = Counter()  # what the last note_waiting counted
        self.held: set[int] = set()  # id(keys) of requests the scheduler holds back

    @rule(prompt=PROMPTS, reuse=st.integers(0, 100), twice=st.booleans())
    def enqueue(self, prompt, reuse, twice):
        if self.history:
            prompt = (self.history[reuse % len(self.history)] + prompt)[:MAX_PROMPT]
        request = queued(self._keys(prompt))
        self.queue.extend([request] * (1 + twice))

    @precondition(lambda self: self.queue)
    @rule(index=st.integers(0, 100))
    def dequeue(self, index):
        self.queue.pop(index % len(self.queue))

    @precondition(lambda self: self.queue)
    @rule(index=st.integers(0, 100))
    def hold_or_release(self, index):
        self.held ^= {id(self.queue[index % len(self.queue)].keys)}

    @rule()
    def note_waiting(self):
        tree = self.kv.tree
        before = {n: n.queued for n in tree.nodes()}
        held = {id(r.keys) for r in self.queue} & self.held
        expected = Counter(
            n
            for r in self.queue
            if id(r.keys) not in held
            for n in tree.peek_path(r.keys, r.namespace)
        )
        changed = self.kv.note_queue(((r.keys, r.namespace) for r in self.queue), held)
        if not self.kv.policy.queue_aware:
            assert changed == 0
            return
        gone = self.counted.keys() - expected.keys()
        assert changed == len(gone) + sum(before[n] != c for n, c in expected.items())
        for node in gone:
            assert node.queued == 0
        for node, count in expected.items():
            assert node.queued == count
        self.counted = expected

    @invariant()
    def queued_prefixes_are_the_trees(self):
        for r in self.queue:
            assert self.kv.queued_cached_blocks(r.keys) == sum(self.kv.tree.peek_prefix(r.keys))


WaitingMachine.TestCase.settings = KVManagerMachine.TestCase.settings  # soak profile too
TestWaitingMachine = WaitingMachine.TestCase
