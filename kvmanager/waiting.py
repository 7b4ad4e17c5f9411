"""The cached prefixes of the requests waiting for admission, kept as the tree changes (§7.0).

Every scheduler step asks, for each queued request, which cached nodes its prompt runs
through (queue-aware eviction counts them into ``Node.queued``) and how many of its
blocks are cached in each tier (the ranked schedulers order the queue by it). Walking
every queued prompt through the tree on every step costs queue x depth span comparisons
per step; this index walks a prompt again only when the tree changed where its walk went:

* a node on its path was split or removed (the tree's ``on_split`` / ``on_remove`` hooks);
* a child was added under the node where its walk stopped for want of one (``on_insert``).

Nothing else changes which nodes a walk visits or how many blocks it matches in each: a
node's keys change only when it is split, and its children only by those three
operations. Residency may change freely: a prefix's cached length counts blocks in either
tier, and the walk itself never looks at tiers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from pbkv.kvmanager.node import Node
from pbkv.kvmanager.radix import RadixTree

QueuedPrompt = tuple[list[int], str]
"""A queued request as the index sees it: its prompt's block keys and its namespace.

The index knows a request by the identity of its key list: pass the queue's own list,
do not change it while the request is queued, and do not share it between requests of
different namespaces."""


@dataclass(eq=False, slots=True)
class QueuedWalk:
    """One queued prompt's walk down the tree (see :meth:`RadixTree.peek_spans`).

    Kept by :class:`WaitingPrefixes`; callers read it (:meth:`WaitingPrefixes.current_walk`)
    and never modify it.

    Attributes:
        keys: the prompt's block keys (the queue's own list: must not change while queued).
        namespace: its tenant / cache salt.
        copies: times the queue holds this prompt.
        path: nodes the walk visited, root's child first.
        spans: blocks matched in each node of ``path``.
        matched_blocks: their sum (GPU or host: a demotion or load does not change it).
        open_end: the walk stopped for want of a child (keys remain after a fully matched
            last node, or nothing matched): a new child there may extend it.
        whole: every node of ``path`` is matched whole (a match would split none).
        stale: the tree changed where the walk went; walk again before use.
        held: the scheduler holds the request back (see :meth:`WaitingPrefixes.sync`):
            its walk answers prefixes but does not count into nodes.
    """

    keys: list[int]
    namespace: str
    copies: int
    path: tuple[Node, ...] = ()
    spans: tuple[int, ...] = ()
    matched_blocks: int = 0
    open_end: bool = False
    whole: bool = True
    stale: bool = True
    held: bool = False


class WaitingPrefixes:
    """Each queued request's cached prefix, and per node the queued requests through it.

    A request is known by its key list's identity (see :data:`QueuedPrompt`);
    :meth:`sync` sets the queue. Between syncs the tree may change in any way: a walk
    the change touched is marked stale and walked again at the next :meth:`sync`.

    Args:
        tree: the radix tree walked (its hooks must call :meth:`on_split`,
            :meth:`on_remove` and :meth:`on_insert`).
        count_nodes: keep :attr:`counts` and the changes :meth:`take_changes` returns
            (queue-aware eviction); without it only prefixes are answered.
    """

    def __init__(self, tree: RadixTree, *, count_nodes: bool) -> None:
        self._tree = tree
        self._count = count_nodes
        self._walks: dict[int, QueuedWalk] = {}  # id(keys) -> walk
        self._order: list[int] = []  # id(keys) of the last sync's queue, in order
        self._copies = False  # the last sync's queue held a prompt twice
        self._stale: set[QueuedWalk] = set()
        self._through: dict[Node, set[QueuedWalk]] = {}  # walks whose path holds the node
        self._open_at: dict[Node, set[QueuedWalk]] = {}  # open walks stopped at a non-root node
        self._open_at_root: dict[str, set[QueuedWalk]] = {}  # open walks that matched nothing
        self.counts: dict[Node, int] = {}
        """Node -> queued requests whose walk visits it (as of the last :meth:`sync`)."""
        self._before: dict[Node, int] = {}  # counts at the last take_changes, if changed
        self._held: frozenset[int] = frozenset()  # the last sync's held prompts
        self.version = 0
        """Bumped whenever the queue or any walk changes (a cache key for rankings)."""

    def __len__(self) -> int:
        return len(self._walks)

    @property
    def order(self) -> list[int]:
        """``id(keys)`` of the last sync's queue, in queue order (do not modify)."""
        return self._order

    @property
    def current(self) -> bool:
        """Every walk is current (no tree change touched one since the last sync)."""
        return not self._stale

    # -- the queue -------------------------------------------------------------------

    def sync(self, queue: Iterable[QueuedPrompt], held: Collection[int] = ()) -> None:
        """Make the index hold exactly ``queue``'s prompts (:data:`QueuedPrompt` pairs).

        Prompts that left the queue are forgotten, new and stale ones walked; a queue
        and tree unchanged since the last call cost one pass over the queue. ``held``
        names (by ``id`` of their key lists) prompts the scheduler holds back for now:
        their walks still answer prefixes but do not count into :attr:`counts`, since a
        request that waits its turn behind the cohort is no near use of its prefix.

        Mutates: the index only (never the tree).
        """
        prompts = list(queue)
        order = [id(keys) for keys, _ in prompts]
        changed = order != self._order
        if changed:
            self._set_queue(prompts, order)
        held = frozenset(held)
        if changed or held != self._held:
            self._hold(held)
            self._held = held
        for walk in self._stale:
            self._unwalk(walk)
            self._walk(walk)
        self._stale.clear()

    def _set_queue(self, prompts: list[QueuedPrompt], order: list[int]) -> None:
        self.version += 1
        walks = self._walks
        ids = set(order)
        for gone in walks.keys() - ids:
            walk = walks.pop(gone)
            self._unwalk(walk)
            self._stale.discard(walk)
        if len(ids) > len(walks):
            for keys, namespace in prompts:
                if id(keys) not in walks:
                    walk = walks[id(keys)] = QueuedWalk(keys, namespace, 1)
                    self._stale.add(walk)
        copies = len(ids) < len(order)
        if copies or self._copies:  # a prompt queued twice counts twice
            times = Counter(order)
            for key, walk in walks.items():
                if walk.copies != times[key]:
                    self._unwalk(walk)
                    walk.copies = times[key]
                    self._stale.add(walk)
        self._order, self._copies = order, copies

    def _hold(self, held: frozenset[int]) -> None:
        for key, walk in self._walks.items():
            now = key in held
            if now != walk.held:
                if self._count and not walk.stale:  # a stale walk counts when walked again
                    self._add_counts(walk.path, -walk.copies if now else walk.copies)
                walk.held = now

    def cached_blocks(self, keys: list[int], namespace: str = "") -> int | None:
        """Return a queued prompt's blocks cached in either tier (the sum of
        :meth:`RadixTree.peek_prefix`), or ``None`` when the index does not hold it current
        (not in the last sync, or stale since). Does not modify anything."""
        walk = self._walks.get(id(keys))
        if walk is None or walk.stale or walk.keys is not keys or walk.namespace != namespace:
            return None
        return walk.matched_blocks

    def current_walk(self, keys: list[int], namespace: str = "") -> QueuedWalk | None:
        """Return a queued prompt's walk, what :meth:`RadixTree.peek_spans` would give
        now, or ``None`` when the index does not hold it current (see
        :meth:`cached_blocks`). Read it; do not modify it.

        Does not modify anything.
        """
        walk = self._walks.get(id(keys))
        if walk is None or walk.stale or walk.keys is not keys or walk.namespace != namespace:
            return None
        return walk

    def take_changes(self) -> list[tuple[Node, int]]:
        """Return ``(node, count)`` for each node whose count differs from what it was at
        the last call (0: no queued request visits it any more)."""
        before, self._before = self._before, {}
        counts = self.counts
        return [(n, counts.get(n, 0)) for n, old in before.items() if counts.get(n, 0) != old]

    def check_integrity(self) -> None:
        """Assert that every current walk is what walking the tree now gives, and that
        node registrations and counts agree with the recorded walks; raise
        ``AssertionError`` naming the walk or node otherwise."""
        counts: dict[Node, int] = {}
        for walk in self._walks.values():
            if walk.held != (id(walk.keys) in self._held):
                raise AssertionError(f"walk of keys {walk.keys[:8]}: held is {walk.held}")
            for node in walk.path:
                if not walk.held:
                    counts[node] = counts.get(node, 0) + walk.copies
                if walk not in self._through.get(node, ()):
                    raise AssertionError(f"{node}: a walk through it is not registered")
            if walk.stale:
                continue
            path, spans = self._tree.peek_spans(walk.keys, walk.namespace)
            if (list(walk.path), list(walk.spans)) != (path, spans):
                raise AssertionError(
                    f"walk of keys {walk.keys[:8]}: indexed {walk.path} {walk.spans}, "
                    f"the tree gives {path} {spans}"
                )
        if self._count and counts != self.counts:
            wrong = [
                n for n in counts.keys() | self.counts.keys() if counts.get(n) != self.counts.get(n)
            ]
            node = wrong[0]
            raise AssertionError(
                f"{node}: counted {self.counts.get(node, 0)} queued walks, "
                f"the walks give {counts.get(node, 0)} ({len(wrong)} nodes differ)"
            )

    # -- tree hooks ------------------------------------------------------------------

    def on_split(self, node: Node) -> None:
        """``node`` was split: walks through it must be walked again."""
        self._mark_stale(self._through.get(node))

    def on_remove(self, node: Node) -> None:
        """``node`` left the tree: walks through it must be walked again."""
        self._mark_stale(self._through.get(node))

    def on_insert(self, leaf: Node) -> None:
        """``leaf`` was added: open walks stopped at its parent may go further."""
        parent = leaf.parent
        assert parent is not None
        if parent.is_root:
            self._mark_stale(self._open_at_root.get(parent.namespace))
        else:
            self._mark_stale(self._open_at.get(parent))

    # -- internals -------------------------------------------------------------------

    def _mark_stale(self, walks: set[QueuedWalk] | None) -> None:
        if walks:
            for walk in walks:
                walk.stale = True
            self._stale.update(walks)
            self.version += 1

    def _walk(self, walk: QueuedWalk) -> None:
        path, spans = self._tree.peek_spans(walk.keys, walk.namespace)
        walk.path, walk.spans, walk.stale = tuple(path), tuple(spans), False
        walk.matched_blocks = matched = sum(spans)
        walk.whole = not path or spans[-1] == path[-1].num_blocks
        walk.open_end = matched < len(walk.keys) and walk.whole
        for node in path:
            self._through.setdefault(node, set()).add(walk)
        if walk.open_end:
            if path:
                self._open_at.setdefault(path[-1], set()).add(walk)
            else:
                self._open_at_root.setdefault(walk.namespace, set()).add(walk)
        if self._count and not walk.held:
            self._add_counts(path, walk.copies)

    def _unwalk(self, walk: QueuedWalk) -> None:
        for node in walk.path:
            _discard(self._through, node, walk)
        if walk.open_end:
            if walk.path:
                _discard(self._open_at, walk.path[-1], walk)
            else:
                _discard(self._open_at_root, walk.namespace, walk)
        if self._count and not walk.held:
            self._add_counts(walk.path, -walk.copies)
        walk.path, walk.spans, walk.open_end, walk.stale = (), (), False, True

    def _add_counts(self, path: Iterable[Node], delta: int) -> None:
        counts, before = self.counts, self._before
        for node in path:
            old = counts.get(node, 0)
            if node not in before:
                before[node] = old
            new = old + delta
            if new:
                counts[node] = new
            else:
                del counts[node]


def _discard(index: dict, key: object, walk: QueuedWalk) -> None:
    walks = index.get(key)
    if walks is not None:
        walks.discard(walk)
        if not walks:
            del index[key]
