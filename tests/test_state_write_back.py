"""The write-back of StateStore (issue 19): state written before each commit, never per batch, and the same state
as writing every batch, whatever the sequence of batches, partitions, expiries and commits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clocktower.streams.state_store import StateStore


class _Codec:
    def encode_state(self, value: int) -> bytes:
        return str(value).encode()

    def decode_state(self, data: bytes) -> int:
        return int(data)


class _PartitionedBacking(dict):
    """A dict that records each partition's writes, as the Faust table's backing receives them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, list[tuple[bytes, bytes]], list[bytes]]] = []
        self.by_partition: dict[bytes, int] = {}

    def write(self, partition: int, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        self.calls.append((partition, puts, deletes))
        for k, v in puts:
            self[k] = v
            self.by_partition[k] = partition
        for k in deletes:
            self.pop(k, None)
            self.by_partition.pop(k, None)


KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, st.integers(0, 100)),
    st.tuples(st.just("delete"), KEYS, st.just(0)),
    st.tuples(st.just("expire"), st.just(""), st.integers(0, 100)),
    st.tuples(st.just("partition"), st.just(""), st.integers(0, 1)),
    st.tuples(st.just("commit"), st.just(""), st.just(0)),
    st.tuples(st.just("read"), KEYS, st.just(0)),
), max_size=80)


def _apply(store: StateStore, op: str, key: str, t: int, n: int) -> object:
    if op == "put":
        store.put(key, n, t)
    elif op == "delete":
        store.delete(key)
    elif op == "expire":
        return store.expire(t)
    elif op == "partition":
        store.flush()            # a batch is of one partition
        store.partition = t
    elif op == "read":
        return store.get(key)
    return None


@settings(max_examples=400, deadline=None)
@given(OPS, st.integers(1, 6))
def test_write_back_reads_and_stores_what_writing_every_batch_does(ops: list[tuple[str, str, int]],
                                                                   max_pending: int) -> None:
    """Every read and expiry is the same as with a write per batch, and after a commit so is the backing, each
    entry in the partition that wrote it; never more writes. (`max_pending` small: early writes are exercised.)"""
    through: dict[bytes, bytes] = {}
    plain = StateStore(_Codec(), through)
    backing = _PartitionedBacking()
    cached = StateStore(_Codec(), backing, write_back=True, max_pending=max_pending)
    written_from: dict[bytes, int] = {}     # the partition whose batch last put each key
    for n, (op, key, t) in enumerate(ops):
        if op == "commit":                   # between batches: the commit sensor runs while no batch does
            cached.flush()
            plain.flush()
            cached.write_pending()
            assert backing == through
            assert {k: written_from[k] for k in backing} == backing.by_partition   # sent to its own partition
            continue
        if op == "put":
            written_from[key.encode()] = cached.partition
        assert _apply(cached, op, key, t, n) == _apply(plain, op, key, t, n)
        if n % 3 == 0:           # a batch ends now and then
            cached.flush()
            plain.flush()
    cached.flush()
    plain.flush()
    cached.write_pending()
    assert backing == through
    assert cached.writes <= plain.writes
    assert cached.entries == plain.entries and cached.expired == plain.expired


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_a_crash_loses_only_what_was_not_committed(ops: list[tuple[str, str, int]]) -> None:
    """Dropping what is pending and reloading (a worker killed, or its partitions revoked) leaves the state a store
    writing every batch had at the last commit: its entries, and the counts, reads and expiries of a reload."""
    through: dict[bytes, bytes] = {}
    plain = StateStore(_Codec(), through)
    at_commit: dict[bytes, bytes] = {}
    store = StateStore(_Codec(), _PartitionedBacking(), write_back=True)
    for n, (op, key, t) in enumerate(ops):
        if op == "commit":
            store.flush()
            plain.flush()
            store.write_pending()
            at_commit = dict(through)
        else:
            _apply(store, op, key, t, n)
            _apply(plain, op, key, t, n)
    store.flush()
    store.reload()                              # the crash: what was pending is gone
    assert store.pending == 0 and dict(store.backing) == at_commit
    then = StateStore(_Codec(), dict(at_commit))
    then.reload()
    assert store.entries == then.entries
    for key in "abcde":
        assert store.get(key) == then.get(key)
    store.partition = then.partition = 0
    assert store.expire(10**6) == then.expire(10**6)


def test_an_entry_made_and_deleted_between_commits_is_never_written() -> None:
    """A half-join that completes before the commit never reaches the table or its changelog."""
    backing = _PartitionedBacking()
    store = StateStore(_Codec(), backing, write_back=True)
    for batch in range(100):
        store.put(f"half-{batch}", batch, 10**9)
        store.flush()
        store.delete(f"half-{batch}")
        store.flush()
    assert store.write_pending() == 0 and backing.calls == [] and store.writes == 0


def test_a_key_written_in_every_batch_is_written_once_per_commit() -> None:
    backing = _PartitionedBacking()
    store = StateStore(_Codec(), backing, write_back=True)
    for commit in range(3):
        for batch in range(1000):
            store.put("gpu-0", commit * 1000 + batch, 10**9)
            store.flush()
        assert store.write_pending() == 1
    assert store.writes == 3 and backing[b"gpu-0"].endswith(b"2999")


def test_deleting_a_committed_entry_writes_one_tombstone_to_its_partition() -> None:
    backing = _PartitionedBacking()
    store = StateStore(_Codec(), backing, write_back=True)
    store.partition = 3
    store.put("k", 1, 10**9)
    store.flush()
    store.write_pending()
    store.delete("k")
    store.put("k", 2, 10**9)
    store.delete("k")
    store.flush()
    assert store.write_pending() == 1
    assert backing.calls[-1] == (3, [], [b"k"]) and backing == {}


def test_pending_entries_past_the_limit_are_written_early() -> None:
    backing = _PartitionedBacking()
    store = StateStore(_Codec(), backing, write_back=True, max_pending=10)
    for i in range(11):
        store.put(f"k{i}", i, 10**9)
    store.flush()
    assert store.pending == 0 and len(backing) == 11
