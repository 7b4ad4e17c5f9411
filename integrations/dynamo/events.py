"""KV events from a pbkv radix tree, in the form Dynamo's KV router consumes (§7.6).

Plain synchronous code (no trio, no Dynamo import): :class:`KvEventRelay` chains itself
onto a :class:`~pbkv.kvmanager.RadixTree`'s hooks (keeping the KV manager's own) and
turns what the tree does into :class:`Stored` / :class:`Removed` records for a
``dynamo.llm.KvEventPublisher`` (``publish_stored`` / ``publish_removed``).

The router hashes block *content* from the token ids it is sent, while the tree keeps
only block keys, so the relay learns each block's tokens from the requests the worker
serves (:meth:`KvEventRelay.learn`: the prompt when a request starts, its output when it
ends) and publishes an inserted node as soon as its tokens are known: prompt blocks at
insertion, output blocks when the request ends. Block ids are pbkv's 128-bit block keys
folded to non-negative signed 64-bit ints (:func:`block_id`).

A GPU copy demoted to the host tier stays matchable in pbkv (a host hit), so it is not
reported removed: the router keeps counting it; it is removed when the host copy is
dropped too. (Reporting it as a host-tier block needs Dynamo's ZMQ relay with a
``medium`` field; the push publisher has no tier argument.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pbkv.kvmanager import Node, RadixTree, block_keys

_ID_MASK = (1 << 63) - 1


def block_id(key: int) -> int:
    """Return the Dynamo block id of a pbkv block key: its low 63 bits (a non-negative
    signed 64-bit int, as ``KvEventPublisher`` takes)."""
    return key & _ID_MASK


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks stored, a chain below ``parent_id`` (``None``: from the prompt's start).

    Shapes:
        token_ids: ``(len(block_ids) * block_size,)``.
    """

    token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    parent_id: int | None
    block_size: int


@dataclass(frozen=True, slots=True)
class Removed:
    """Blocks no longer cached in any tier."""

    block_ids: tuple[int, ...]


Event = Stored | Removed


class KvEventRelay:
    """Turns a radix tree's inserts and removals into KV events.

    Args:
        tree: the replica's radix tree; its ``on_insert``, ``on_split`` and ``on_remove`` hooks are
            wrapped (the previous callbacks still run first).

    Mutates: ``tree.hooks`` once, at construction.
    """

    def __init__(self, tree: RadixTree, on_events: Callable[[], None] | None = None) -> None:
        self.block_size = tree.block_size
        self.on_events = on_events
        self._tokens: dict[int, tuple[int, ...]] = {}  # block key -> its tokens
        self._refs: Counter[int] = Counter()  # block key -> requests that taught it
        self._pending: list[Node] = []  # inserted nodes not yet published
        self._published: set[int] = set()  # block keys the router holds
        self._events: list[Event] = []
        hooks = tree.hooks
        inner_insert, inner_remove, inner_split = hooks.on_insert, hooks.on_remove, hooks.on_split

        def on_insert(leaf: Node) -> None:
            inner_insert(leaf)
            self._pending.append(leaf)
            self._flush()

        def on_split(node: Node, top: Node) -> None:
            inner_split(node, top)
            if any(n is node for n in self._pending):  # the upper part is unpublished too
                at = next(i for i, n in enumerate(self._pending) if n is node)
                self._pending.insert(at, top)

        def on_remove(node: Node) -> None:
            inner_remove(node)
            self._removed(node)

        hooks.on_insert = on_insert
        hooks.on_split = on_split
        hooks.on_remove = on_remove

    def learn(self, token_ids: Sequence[int], namespace: str = "") -> None:
        """Learn the tokens of each full block of ``token_ids`` (a request's prompt when
        it starts, prompt + output when it ends), and publish the pending inserts they
        complete. Each :meth:`learn` is undone by one :meth:`forget` of the same ids.

        Mutates: the relay's token map and event queue.
        """
        bs = self.block_size
        for i, key in enumerate(block_keys(token_ids, bs, namespace)):
            self._refs[key] += 1
            if key not in self._tokens:
                self._tokens[key] = tuple(token_ids[i * bs : (i + 1) * bs])
        self._flush()

    def forget(self, token_ids: Sequence[int], namespace: str = "") -> None:
        """Undo one :meth:`learn` of ``token_ids``: tokens no request still holds are
        dropped (published blocks no longer need them).

        Mutates: the relay's token map.
        """
        for key in block_keys(token_ids, self.block_size, namespace):
            left = self._refs[key] - 1
            if left > 0:
                self._refs[key] = left
                continue
            del self._refs[key]
            self._tokens.pop(key, None)

    def drain(self) -> list[Event]:
        """Return the events since the last drain, oldest first, and forget them."""
        events, self._events = self._events, []
        return events

    def published_blocks(self) -> int:
        """Return how many blocks the router has been told are cached."""
        return len(self._published)

    def _flush(self) -> None:
        """Publish pending nodes whose tokens are known, parents first; a node waits
        while its tokens, or an unpublished ancestor's, are not known."""
        waiting: list[Node] = []
        held: set[int] = set()  # serials of waiting nodes
        for node in self._pending:
            keys = [k for k in node.keys if k not in self._published]
            above = node.parent
            if (above is not None and above.serial in held) or any(
                k not in self._tokens for k in keys
            ):
                waiting.append(node)
                held.add(node.serial)
                continue
            if keys:
                self._publish(node, keys)
        self._pending = waiting
        self._notify()

    def _notify(self) -> None:
        if self._events and self.on_events is not None:
            self.on_events()

    def _publish(self, node: Node, keys: list[int]) -> None:
        first = node.keys.index(keys[0])
        if first:
            parent: int | None = node.keys[first - 1]
        else:
            above = node.parent
            parent = above.keys[-1] if above is not None and above.keys else None
        tokens = tuple(t for k in keys for t in self._tokens[k])
        self._events.append(
            Stored(
                tokens,
                tuple(block_id(k) for k in keys),
                None if parent is None else block_id(parent),
                self.block_size,
            )
        )
        self._published.update(keys)

    def _removed(self, node: Node) -> None:
        gone = [k for k in node.keys if k in self._published]
        for k in node.keys:
            self._published.discard(k)
        if gone:
            self._events.append(Removed(tuple(block_id(k) for k in gone)))
        self._pending = [n for n in self._pending if n is not node]
        self._notify()
