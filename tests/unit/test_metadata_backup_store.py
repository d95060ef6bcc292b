"""Logical metadata backups (kafscale/metadata/backup.py) on the embedded SQLite store: what a
backup holds, what a restore refuses, and that of many restorers exactly one restores."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest

from kafscale.metadata.backup import BackupError, backup, read, restore, restore_markers
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import MetadataStore


def store_at(path: Path) -> SqliteMetadataStore:
    return SqliteMetadataStore(str(path))


def fill(store: MetadataStore) -> None:
    store.put("/kafscale/ns/topics/orders", b'{"partitions": 3}')
    store.put("/kafscale/ns/topics/orders/0", b"\x00\x01binary")
    store.put("/kafscale/other/topics/x", b"another cluster's")
    lease = store.grant_lease(30)
    store.put("/kafscale/ns/brokers/0", b"alive", lease.id)  # a process's: left out


def test_a_backup_holds_the_namespaces_keys_not_on_a_lease(tmp_path: Path) -> None:
    store = store_at(tmp_path / "a.sqlite")
    fill(store)
    data, header = backup(store, "ns", now_ms=1234)
    assert (header.namespace, header.keys, header.taken_ms) == ("ns", 2, 1234)
    read_header, entries = read(data)
    assert read_header == header
    assert dict(entries) == {
        "/kafscale/ns/topics/orders": b'{"partitions": 3}',
        "/kafscale/ns/topics/orders/0": b"\x00\x01binary",
    }


def test_a_restore_writes_every_key_once(tmp_path: Path) -> None:
    source = store_at(tmp_path / "a.sqlite")
    fill(source)
    data, _ = backup(source, "ns")
    target = store_at(tmp_path / "b.sqlite")
    assert restore(target, data, "ns", max_txn_ops=1) == "restored 2 keys"
    restored = {kv.key: kv.value for kv in target.get_prefix("/kafscale/ns/topics/")}
    assert restored == {
        "/kafscale/ns/topics/orders": b'{"partitions": 3}',
        "/kafscale/ns/topics/orders/0": b"\x00\x01binary",
    }
    running, done = restore_markers("ns")
    assert target.get(done) is not None and target.get(running) is None
    assert restore(target, data, "ns", max_txn_ops=100) == "already restored"
    # The markers are never part of a later backup.
    again, header = backup(target, "ns")
    assert header.keys == 2 and b"restore/" not in gzip.decompress(again)


def test_a_namespace_with_data_is_not_written_over(tmp_path: Path) -> None:
    source = store_at(tmp_path / "a.sqlite")
    fill(source)
    data, _ = backup(source, "ns")
    target = store_at(tmp_path / "b.sqlite")
    target.put("/kafscale/ns/topics/new", b"newer")
    assert restore(target, data, "ns", max_txn_ops=10) == "not empty"
    assert target.get("/kafscale/ns/topics/orders") is None


def test_a_backup_of_another_namespace_or_a_broken_one_is_refused(tmp_path: Path) -> None:
    source = store_at(tmp_path / "a.sqlite")
    fill(source)
    data, _ = backup(source, "ns")
    target = store_at(tmp_path / "b.sqlite")
    with pytest.raises(BackupError, match="of namespace 'ns', not 'prod'"):
        restore(target, data, "prod", max_txn_ops=10)
    with pytest.raises(BackupError, match="not a KafScale metadata backup"):
        read(b"plain text")
    lines = gzip.decompress(data).decode().splitlines()
    with pytest.raises(BackupError, match="holds 1 keys, its header says 2"):
        read(gzip.compress("\n".join(lines[:2]).encode()))
    header = json.loads(lines[0])
    outside = json.dumps({"k": "/kafscale/other/x", "v": ""})
    with pytest.raises(BackupError, match="outside the backup's namespace"):
        read(gzip.compress("\n".join([json.dumps(header), outside, lines[2]]).encode()))
    header["version"] = 99
    with pytest.raises(BackupError, match="version 99"):
        read(gzip.compress("\n".join([json.dumps(header), *lines[1:]]).encode()))


def test_of_many_restorers_at_once_exactly_one_restores(tmp_path: Path) -> None:
    source = store_at(tmp_path / "a.sqlite")
    for n in range(50):
        source.put(f"/kafscale/ns/topics/t{n}", str(n).encode())
    data, _ = backup(source, "ns")
    path = tmp_path / "shared.sqlite"
    store_at(path).close()
    outcomes: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        store = store_at(path)
        try:
            outcome = restore(store, data, "ns", max_txn_ops=7, wait=lambda _: None)
        finally:
            store.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["already restored"] * 5 + ["restored 50 keys"]
    assert len(store_at(path).get_prefix("/kafscale/ns/topics/")) == 50
