"""StateStore: what a processor's table holds after any sequence of writes, deletes, expiries and reloads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clocktower.streams.state_store import StateStore


class _Codec:
    def encode_state(self, value: int) -> bytes:
        return str(value).encode()

    def decode_state(self, data: bytes) -> int:
        return int(data)


KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, st.integers(0, 100)),
    st.tuples(st.just("delete"), KEYS, st.just(0)),
    st.tuples(st.just("expire"), st.just(""), st.integers(0, 100)),
    st.tuples(st.just("reload"), st.just(""), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_table_matches_a_model_after_any_sequence(ops: list[tuple[str, str, int]]) -> None:
    backing: dict[bytes, bytes] = {}
    store = StateStore(_Codec(), backing)
    model: dict[str, tuple[int, int]] = {}   # key -> (value, expires)
    expired_total = 0
    for n, (op, key, t) in enumerate(ops):
        if op == "put":
            store.put(key, n, t)
            model[key] = (n, t)
        elif op == "delete":
            store.delete(key)
            model.pop(key, None)
        elif op == "expire":
            gone = store.expire(t)
            due = {k: v for k, (v, e) in model.items() if e <= t}
            assert dict(gone) == due
            expired_total += len(due)
            for k in due:
                del model[k]
        else:
            store.flush()
            store.reload()
        store.flush()   # the end of a batch
        assert {k.decode(): int(v[10:]) for k, v in backing.items()} == {k: v for k, (v, _) in model.items()}
    assert store.expired == expired_total


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_a_capped_table_refuses_only_new_keys_and_counts_what_it_holds(ops: list[tuple[str, str, int]]) -> None:
    """With room for 3 keys: a new key past that is refused (counted), a kept key is always updated, and a delete
    or an expiry makes room, after a reload too."""
    store = StateStore(_Codec(), {}, max_entries=3)
    model: dict[str, tuple[int, int]] = {}
    refused = 0
    for n, (op, key, t) in enumerate(ops):
        if op == "put":
            store.put(key, n, t)
            if key in model or len(model) < 3:
                model[key] = (n, t)
            else:
                refused += 1
        elif op == "delete":
            store.delete(key)
            model.pop(key, None)
        elif op == "expire":
            for k, _ in store.expire(t):
                del model[k]
        else:
            store.flush()
            store.reload()
        store.flush()
        assert {k.decode() for k in store.backing} == set(model)
        assert store.entries.get(0, 0) == len(model) and store.refused == refused


PART_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, st.booleans()),
    st.tuples(st.just("delete"), KEYS, st.just(False)),
    st.tuples(st.just("partition"), st.just(""), st.booleans()),
    st.tuples(st.just("flush"), st.just(""), st.just(False)),
    st.tuples(st.just("reload"), st.just(""), st.just(False)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(PART_OPS)
def test_entry_counts_hold_over_partitions_batches_and_uncapped_keys(ops: list[tuple[str, str, bool]]) -> None:
    """Found in review: a key rewritten from another partition moved its header but not its count. Now each key is
    counted under the partition that last wrote it, whatever the batches; `capped=False` keys pass a full one."""
    store = StateStore(_Codec(), {}, max_entries=2)
    model: dict[str, int] = {}    # key -> its partition
    for n, (op, key, flag) in enumerate(ops):
        if op == "put":
            full = sum(1 for p in model.values() if p == store.partition) >= 2
            store.put(key, n, 10**9, capped=not flag)
            if key in model or not full or flag:
                model[key] = store.partition
        elif op == "delete":
            store.delete(key)
            model.pop(key, None)
        elif op == "partition":
            store.flush()                      # a batch is of one partition
            store.partition = int(flag)
        elif op == "flush":
            store.flush()
        else:
            store.flush()
            store.reload()
        counts = {p: sum(1 for q in model.values() if q == p) for p in (0, 1)}
        assert {p: store.entries.get(p, 0) for p in (0, 1)} == counts
    store.flush()
    assert {k.decode() for k in store.backing} == set(model)


def test_rewriting_a_key_keeps_one_index_entry_and_its_latest_expiry() -> None:
    store = StateStore(_Codec())
    for t in range(10_000):
        store.put("k", t, t + 100)
        store.flush()
        assert store.expire(t) == []
    assert sum(len(h) for h in store._expiry.values()) == 1
    assert store.expire(10_099) == [("k", 9_999)]


def test_expiry_touches_only_the_partition_being_processed() -> None:
    """A table may be written only from its own partition's events: entries of others wait for theirs."""
    store = StateStore(_Codec())
    store.partition = 1
    store.put("p1", 1, 10)
    store.partition = 2
    store.put("p2", 2, 10)
    store.flush()
    assert store.expire(50) == [("p2", 2)]
    store.partition = 1
    assert store.expire(50) == [("p1", 1)]


def test_an_entry_keeps_the_partition_it_was_written_from_across_a_reload() -> None:
    backing: dict[bytes, bytes] = {}
    store = StateStore(_Codec(), backing)
    store.partition = 1
    store.put("p1", 1, 10)
    store.partition = 2
    store.flush()
    store.reload()
    assert store.expire(50) == []
    store.partition = 1
    assert store.expire(50) == [("p1", 1)]
