"""Memos by object identity and keys hashed once, for the planner's hot paths.

Why: a pydantic model's hash walks every field on each call (a plan's key hashes its ~50 StagePlans, each with
its device tuple) and a tuple never keeps its hash, while the planner asks for the same plan's or stage's derived
values several times (the space prices a plan, the search then evaluates that very object; a StagePlan is shared
by every cut that holds it). Frozen values only: what is remembered for an object must not change while it lives.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["ByIdentity", "HashedKey"]

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """A value per object, found by identity: each entry keeps its object alive, so its id is not reused while the
    entry lives. `limit`: at most that many entries, the oldest dropped first (None: no bound, for objects the
    planner keeps alive anyway)."""

    __slots__ = ("_items", "_limit")

    def __init__(self, limit: int | None = None) -> None:
        self._items: dict[int, tuple[Any, V]] = {}
        self._limit = limit

    def get(self, obj: object) -> V | None:
        hit = self._items.get(id(obj))
        return hit[1] if hit is not None and hit[0] is obj else None

    def put(self, obj: object, value: V) -> V:
        items = self._items
        items[id(obj)] = (obj, value)
        if self._limit is not None and len(items) > self._limit:
            try:  # another thread may drop the same oldest entry meanwhile: a memo, so either is fine
                items.pop(next(iter(items)), None)
            except (RuntimeError, StopIteration):
                pass
        return value

    def __len__(self) -> int:
        return len(self._items)


class HashedKey:
    """A key tuple whose hash is computed once (dict lookups with it hash nothing again); equal when the tuples
    are. Pickled as its tuple, so another process (another string hash seed) hashes it afresh."""

    __slots__ = ("items", "_hash")

    def __init__(self, items: tuple) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, HashedKey) and self._hash == other._hash and self.items == other.items

    def __reduce__(self) -> tuple:
        return (HashedKey, (self.items,))

    def __repr__(self) -> str:
        return f"HashedKey({self.items!r})"
