"""Contract tests of ``DeleteRange`` (keys ``start <= k < end``), against SQLite and a real etcd:
the ``backend`` fixture of ``test_metadata_store_contract.py``. A range delete is one operation
of a transaction, atomic with its puts and compares; watchers see one DELETE per key deleted.
"""

from __future__ import annotations

import pytest

from kafscale.metadata import Compare, EventType, MetadataStoreError, Put
from kafscale.metadata.store import DeleteRange, Operation
from tests.unit.metadata import test_metadata_store_contract as contract

Backend = contract.Backend
backend = contract.backend  # the fixture: one run per backend


def put_all(backend: Backend, names: list[str]) -> int:
    revision = 0
    for name in names:
        revision = backend.store.put(backend.prefix + name, name.encode())
    return revision


def names(backend: Backend) -> list[str]:
    return [kv.key[len(backend.prefix) :] for kv in backend.store.get_prefix(backend.prefix)]


def test_delete_range_is_half_open_and_bytewise(backend: Backend) -> None:
    p = backend.prefix
    put_all(backend, ["s/0001", "s/0002", "s/0003", "s/0010", "s/0020", "t"])
    result = backend.store.transaction([], [DeleteRange(p + "s/0002", p + "s/0020")])
    assert result.succeeded
    assert names(backend) == ["s/0001", "s/0020", "t"]


def test_delete_range_with_puts_and_compares_is_atomic(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    put_all(backend, [f"seg/{base:020d}" for base in range(10)])
    first = store.get(p + f"seg/{0:020d}")
    assert first is not None
    replace: list[Operation] = [
        Put(p + f"seg/{0:020d}", b"segment"),
        DeleteRange(p + f"seg/{1:020d}", p + f"seg/{10:020d}"),
    ]
    stale = store.transaction([Compare(first.key, mod_revision=first.mod_revision - 1)], replace)
    assert not stale.succeeded
    assert len(names(backend)) == 10  # the failed branch deleted nothing
    holds = [Compare(first.key, value=first.value), Compare(first.key, first.mod_revision)]
    done = store.transaction(
        holds,
        replace,
        [DeleteRange(p, p + "~")],  # the failure branch would delete everything
    )
    assert done.succeeded and done.revision > stale.revision
    kvs = store.get_prefix(p)
    assert [(kv.key, kv.value, kv.mod_revision) for kv in kvs] == [
        (p + f"seg/{0:020d}", b"segment", done.revision)
    ]


def test_delete_range_in_the_failure_branch(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    put_all(backend, ["a", "b", "c"])
    result = store.transaction([Compare.absent(p + "a")], [], [DeleteRange(p + "a", p + "c")])
    assert not result.succeeded
    assert names(backend) == ["c"]


def test_empty_delete_range_changes_nothing(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    revision = put_all(backend, ["a", "b"])
    assert store.transaction([], [DeleteRange(p + "b", p + "b")]).succeeded
    assert store.transaction([], [DeleteRange(p + "b", p + "a")]).succeeded
    assert store.transaction([], [DeleteRange(p + "x", p + "y")]).succeeded
    assert names(backend) == ["a", "b"]
    assert store.revision() >= revision
    assert store.get(p + "b").mod_revision == revision  # type: ignore[union-attr]


def test_watchers_see_one_delete_per_key_at_one_revision(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    put_all(backend, ["w/a", "w/b", "w/c", "x"])
    seen = contract.Collector()
    watch = store.watch_prefix(p, seen)
    result = store.transaction([], [DeleteRange(p + "w/", p + "x~"), Put(p + "y", b"1")])
    events = seen.wait_for(5)
    assert seen.seen() == [
        (EventType.DELETE, p + "w/a", b""),
        (EventType.DELETE, p + "w/b", b""),
        (EventType.DELETE, p + "w/c", b""),
        (EventType.DELETE, p + "x", b""),
        (EventType.PUT, p + "y", b"1"),
    ]
    assert {event.mod_revision for event in events} == {result.revision}
    watch.cancel()


def test_a_put_inside_a_deleted_range_is_refused(backend: Backend) -> None:
    store, p = backend.store, backend.prefix
    put_all(backend, ["a", "b"])
    with pytest.raises(MetadataStoreError):
        store.transaction([], [DeleteRange(p + "a", p + "c"), Put(p + "b", b"new")])
    assert names(backend) == ["a", "b"]
