"""The planner's identity memos (hetauto.planner.identity_memo): values found by the object itself, never by an
equal one or a recycled id; keys hashed once that still compare and pickle by value."""

import pickle

from hetauto.planner.identity_memo import ByIdentity, HashedKey


def test_by_identity_finds_only_the_object_itself():
    memo: ByIdentity[str] = ByIdentity()
    a, b = (1, [2]), (1, [2])  # equal, not the same object
    memo.put(a, "a")
    assert memo.get(a) == "a" and memo.get(b) is None


def test_by_identity_keeps_its_objects_alive_and_drops_the_oldest_past_its_limit():
    memo: ByIdentity[int] = ByIdentity(limit=2)
    objs = [object() for _ in range(3)]
    for i, o in enumerate(objs):
        memo.put(o, i)
    assert len(memo) == 2 and memo.get(objs[0]) is None and memo.get(objs[1]) == 1 and memo.get(objs[2]) == 2


def test_hashed_key_equals_and_hashes_as_its_tuple_and_pickles_by_value():
    k = HashedKey(("a", (1, 2), 3.0))
    assert k == HashedKey(("a", (1, 2), 3.0)) and k != HashedKey(("a", (1, 2), 4.0)) and k != ("a", (1, 2), 3.0)
    assert hash(k) == hash(("a", (1, 2), 3.0))
    back = pickle.loads(pickle.dumps(k))
    assert back == k and {k: 1}[back] == 1
