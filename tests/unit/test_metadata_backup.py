"""Logical metadata backups (kafscale/metadata/backup.py, backup_cli.py) on the embedded SQLite
store: what a backup holds and leaves out, its file format, what a restore refuses, that it never
writes over a namespace with data, runs once however many restorers start together, finishes when
run again after being cut short, and keeps each transaction within etcd's limits."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kafscale.metadata.backup import BackupError, Header, backup, read, restore, restore_markers
from kafscale.metadata.backup_cli import stale_backups
from kafscale.metadata.records import Keys
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import (
    Compare,
    KeyValue,
    Lease,
    MetadataStoreUnavailable,
    Operation,
    Put,
    TxnResult,
)
from tests.harness.paths import ROOT

NS = "prod-kafka"
ROOT_KEY = Keys(NS).root
BINARY = bytes(range(256))


def store_at(path: Path) -> SqliteMetadataStore:
    return SqliteMetadataStore(str(path))


def fill(store: SqliteMetadataStore) -> dict[str, bytes]:
    """A namespace's metadata, with keys a backup must leave out; returns what it must hold."""
    keys = Keys(NS)
    kept = {
        keys.cluster_id: b"cluster-1",
        keys.topic("orders"): json.dumps({"partitions": 3}).encode(),
        keys.topic("orders") + "/0": BINARY,
        keys.topic("orders") + "/1": b"",
        keys.root + "groups/g1/offsets": b"\x00" * 1000,
    }
    for key, value in kept.items():
        store.put(key, value)
    lease = store.grant_lease(60)  # a live broker's: registration, leadership, the chores
    for key in (keys.broker(0), keys.leader("orders", 0), keys.chores):
        store.put(key, b"held", lease.id)
    # Other namespaces, one sharing the first letters of this one's name.
    store.put(Keys(NS + "-eu").topic("orders"), b"another cluster")
    store.put(Keys("other").topic("x"), b"another cluster")
    store.put("/unrelated", b"not kafscale's")
    return kept


def namespace_keys(store: SqliteMetadataStore, namespace: str = NS) -> dict[str, bytes]:
    """The namespace's keys and values, without a restore's markers."""
    markers = Keys(namespace).root + "restore/"
    return {
        kv.key: kv.value
        for kv in store.get_prefix(Keys(namespace).root)
        if not kv.key.startswith(markers)
    }


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = store_at(tmp_path / "source.sqlite")
    yield store
    store.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    store = store_at(tmp_path / "target.sqlite")
    yield store
    store.close()


# --- what a backup holds -------------------------------------------------------------------------


def test_a_backup_round_trips_the_namespace(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    kept = fill(source)
    data, header = backup(source, NS, now_ms=1_790_000_000_123)
    included = [kv for kv in source.get_prefix(ROOT_KEY) if kv.key in kept]
    assert header == Header(
        namespace=NS,
        revision=max(kv.mod_revision for kv in included),
        keys=len(kept),
        taken_ms=1_790_000_000_123,
    )
    assert restore(target, data, NS, max_txn_ops=128) == f"restored {len(kept)} keys"
    assert namespace_keys(target) == kept
    # Nothing outside the namespace was written.
    assert [kv.key for kv in target.get_prefix("/") if not kv.key.startswith(ROOT_KEY)] == []


def test_keys_on_a_lease_and_other_namespaces_are_left_out(source: SqliteMetadataStore) -> None:
    kept = fill(source)
    header, entries = read(backup(source, NS)[0])
    assert dict(entries) == kept
    assert header.keys == len(entries)
    keys = Keys(NS)
    assert not {keys.broker(0), keys.leader("orders", 0), keys.chores} & dict(entries).keys()
    assert all(key.startswith(ROOT_KEY) for key, _ in entries)


def test_an_empty_namespace_backs_up_to_no_keys(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    source.put(Keys("other").topic("x"), b"x")
    data, header = backup(source, NS, now_ms=5)
    assert (header.keys, header.revision) == (0, 0)
    assert restore(target, data, NS, max_txn_ops=128) == "restored 0 keys"


def test_a_backup_is_gzipped_json_lines_under_a_header(source: SqliteMetadataStore) -> None:
    kept = fill(source)
    data, header = backup(source, NS, now_ms=42)
    lines = gzip.decompress(data).decode().splitlines()
    assert json.loads(lines[0]) == {
        "format": "kafscale-metadata-backup",
        "version": 1,
        "namespace": NS,
        "revision": header.revision,
        "keys": len(kept),
        "taken_ms": 42,
    }
    rows = [json.loads(line) for line in lines[1:]]
    assert {row["k"]: base64.b64decode(row["v"]) for row in rows} == kept
    assert all(row.keys() == {"k", "v"} for row in rows)


def test_restore_markers_are_never_backed_up(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    kept = fill(source)
    restore(target, backup(source, NS)[0], NS, max_txn_ops=128)
    assert any("restore/" in kv.key for kv in target.get_prefix(ROOT_KEY))  # the done marker
    again, header = backup(target, NS)
    assert header.keys == len(kept)
    assert b"restore/" not in gzip.decompress(again)


# --- what a restore refuses ----------------------------------------------------------------------


def test_a_backup_of_another_namespace_is_refused(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    fill(source)
    data, _ = backup(source, NS)
    with pytest.raises(BackupError, match=f"of namespace '{NS}', not 'staging'"):
        restore(target, data, "staging", max_txn_ops=128)
    assert target.get_prefix("/") == []


def gz(*rows: Any) -> bytes:
    return gzip.compress("\n".join(json.dumps(row) for row in rows).encode())


HEADER = {
    "format": "kafscale-metadata-backup",
    "version": 1,
    "namespace": NS,
    "revision": 9,
    "keys": 1,
    "taken_ms": 1,
}
ROW = {"k": ROOT_KEY + "topics/t", "v": base64.b64encode(b"x").decode()}
CORRUPT = {
    "not-gzip": b"plain text",
    "empty": b"",
    "truncated": gzip.compress(json.dumps(HEADER).encode() * 50)[:40],
    "not-json": gzip.compress(b"{this is not json\n"),
    "no-rows": gzip.compress(b""),
    "no-header": gz(ROW),
    "other-format": gz({**HEADER, "format": "etcd-snapshot"}, ROW),
    "other-version": gz({**HEADER, "version": 2}, ROW),
    "fewer-keys-than-said": gz({**HEADER, "keys": 2}, ROW),
    "more-keys-than-said": gz(HEADER, ROW, {**ROW, "k": ROOT_KEY + "topics/u"}),
    "key-outside": gz(HEADER, {**ROW, "k": "/kafscale/other/topics/t"}),
    "key-of-a-longer-namespace": gz(HEADER, {**ROW, "k": f"/kafscale/{NS}x/topics/t"}),
    "row-without-value": gz(HEADER, {"k": ROW["k"]}),
    "row-without-key": gz(HEADER, {"v": ROW["v"]}),
    "value-not-base64": gz(HEADER, {**ROW, "v": "abc"}),
    "header-without-namespace": gz({k: v for k, v in HEADER.items() if k != "namespace"}, ROW),
    "header-not-an-object": gz(["kafscale-metadata-backup", 1]),
    "row-not-an-object": gz(HEADER, 5),
    "count-not-a-number": gz({**HEADER, "keys": "one"}, ROW),
}


def test_the_corrupt_files_differ_from_a_good_one_only_where_named() -> None:
    header, entries = read(gz(HEADER, ROW))
    assert (header.keys, entries) == (1, [(ROW["k"], b"x")])


@pytest.mark.parametrize("data", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_backup_is_refused_and_nothing_is_written(
    data: bytes, target: SqliteMetadataStore
) -> None:
    with pytest.raises(BackupError):
        restore(target, data, NS, max_txn_ops=128)
    assert target.get_prefix("/") == []


def test_a_namespace_with_data_is_not_written_over(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    fill(source)
    data, _ = backup(source, NS)
    target.put(Keys(NS).topic("newer"), b"written after the loss")
    assert restore(target, data, NS, max_txn_ops=128) == "not empty"
    assert namespace_keys(target) == {Keys(NS).topic("newer"): b"written after the loss"}
    running, done = restore_markers(NS)
    assert target.get(running) is None and target.get(done) is None


def test_other_namespaces_data_does_not_make_it_non_empty(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    kept = fill(source)
    target.put(Keys(NS + "-eu").topic("theirs"), b"x")
    assert restore(target, backup(source, NS)[0], NS, max_txn_ops=128).startswith("restored")
    assert namespace_keys(target) == kept


def test_a_second_restore_says_already_restored(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    kept = fill(source)
    data, _ = backup(source, NS)
    assert restore(target, data, NS, max_txn_ops=128) == f"restored {len(kept)} keys"
    running, done = restore_markers(NS)
    assert target.get(running) is None  # the claim went with its restorer
    marker = json.loads(target.get(done).value)  # type: ignore[union-attr]
    assert marker["revision"] == read(data)[0].revision
    # Whatever the cluster does afterwards, the backup is never applied again.
    target.delete(Keys(NS).topic("orders"))
    source.put(Keys(NS).topic("later"), b"x")
    newer, _ = backup(source, NS)
    assert restore(target, newer, NS, max_txn_ops=128) == "already restored"
    assert restore(target, data, NS, max_txn_ops=128) == "already restored"
    assert Keys(NS).topic("later") not in namespace_keys(target)


# --- many restorers, limits, interruptions -------------------------------------------------------


def test_of_many_restorers_at_once_exactly_one_restores(
    source: SqliteMetadataStore, tmp_path: Path
) -> None:
    for n in range(60):
        source.put(Keys(NS).topic(f"t{n}"), str(n).encode())
    data, _ = backup(source, NS)
    shared = tmp_path / "shared.sqlite"
    store_at(shared).close()
    start = threading.Barrier(6)
    outcomes: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    pause = threading.Event()  # never set: the restorers' back-off, not a clock

    def back_off(seconds: float) -> None:
        pause.wait(0.01)

    def restorer() -> None:
        store = store_at(shared)
        try:
            start.wait(30)
            outcome = restore(store, data, NS, max_txn_ops=8, wait=back_off)
            with lock:
                outcomes.append(outcome)
        except BaseException as exc:  # reported below, with the outcomes
            with lock:
                errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=restorer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(outcomes) == ["already restored"] * 5 + ["restored 60 keys"]
    store = store_at(shared)
    try:
        restored = [kv for kv in store.get_prefix(Keys(NS).topics)]
        assert len(restored) == 60
        # Each key written once: never created and then overwritten by a second restorer.
        assert all(kv.create_revision == kv.mod_revision for kv in restored)
    finally:
        store.close()


class Recording:
    """A store that records the transactions it runs and can fail the ``fail_at``-th one that
    writes backed-up keys (a restorer killed, etcd lost, mid-restore)."""

    def __init__(self, store: SqliteMetadataStore, fail_at: int = 0) -> None:
        self.store = store
        self.fail_at = fail_at
        self.batches: list[list[Put]] = []

    def transaction(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        puts = [op for op in success if isinstance(op, Put)]
        if puts and all("/restore/" not in put.key and put.lease_id == 0 for put in puts):
            self.batches.append(puts)
            if len(self.batches) == self.fail_at:
                raise MetadataStoreUnavailable("etcd at 10.0.0.1:2379 is unavailable")
        return self.store.transaction(compares, success, failure)

    # The rest of MetadataStore, as the store does it.
    def get(self, key: str) -> KeyValue | None:
        return self.store.get(key)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self.store.get_prefix(prefix)

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        return self.store.put(key, value, lease_id)

    def delete(self, key: str) -> bool:
        return self.store.delete(key)

    def grant_lease(self, ttl_seconds: int) -> Lease:
        return self.store.grant_lease(ttl_seconds)


def many_keys(store: SqliteMetadataStore, count: int, size: int = 10) -> dict[str, bytes]:
    kept = {Keys(NS).topic(f"t{n:04d}"): bytes([n % 256]) * size for n in range(count)}
    for key, value in kept.items():
        store.put(key, value)
    return kept


@pytest.mark.parametrize("max_txn_ops", [8, 10, 128])
def test_batches_respect_max_txn_ops(
    source: SqliteMetadataStore, target: SqliteMetadataStore, max_txn_ops: int
) -> None:
    kept = many_keys(source, 100)
    recording = Recording(target)
    outcome = restore(recording, backup(source, NS)[0], NS, max_txn_ops=max_txn_ops)  # type: ignore[arg-type]
    assert outcome == "restored 100 keys"
    assert all(len(batch) <= max_txn_ops for batch in recording.batches)
    assert len(recording.batches) == -(-100 // max_txn_ops)  # no more transactions than needed
    assert sorted(put.key for batch in recording.batches for put in batch) == sorted(kept)
    assert namespace_keys(target) == kept


def test_batches_respect_max_txn_bytes(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    """etcd refuses a request over --max-request-bytes (1.5 MiB by default) whatever its op
    count: 30 keys of 200 KiB fit 128 ops but not one request."""
    kept = many_keys(source, 30, size=200 * 1024)
    limit = 1024 * 1024
    recording = Recording(target)
    outcome = restore(
        recording,  # type: ignore[arg-type]
        backup(source, NS)[0],
        NS,
        max_txn_ops=128,
        max_txn_bytes=limit,
    )
    assert outcome == "restored 30 keys"
    for batch in recording.batches:
        assert sum(len(p.key.encode()) + len(p.value) + 16 for p in batch) <= limit
    assert namespace_keys(target) == kept


def test_a_key_larger_than_max_txn_bytes_goes_alone(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    kept = many_keys(source, 3, size=300 * 1024)
    recording = Recording(target)
    restore(recording, backup(source, NS)[0], NS, max_txn_ops=128, max_txn_bytes=64 * 1024)  # type: ignore[arg-type]
    assert [len(batch) for batch in recording.batches] == [1, 1, 1]
    assert namespace_keys(target) == kept


def test_a_restore_cut_short_finishes_when_run_again(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    """The module's promise: "it is idempotent, so a restore cut short is simply run again".
    The keys of the first batches are in the namespace then; the second run must not take
    them for a cluster's data ("not empty") and leave the restore half done for ever."""
    kept = many_keys(source, 50)
    data, _ = backup(source, NS)
    with pytest.raises(MetadataStoreUnavailable):
        restore(Recording(target, fail_at=3), data, NS, max_txn_ops=8)  # type: ignore[arg-type]
    running, done = restore_markers(NS)
    assert target.get(running) is None and target.get(done) is None  # claim released
    assert 0 < len(namespace_keys(target)) < len(kept)  # half done
    assert restore(target, data, NS, max_txn_ops=8) == "restored 50 keys"
    assert namespace_keys(target) == kept
    assert restore(target, data, NS, max_txn_ops=8) == "already restored"


def test_a_restore_cut_short_is_not_finished_with_another_backup(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    many_keys(source, 50)
    data, _ = backup(source, NS, now_ms=1)
    with pytest.raises(MetadataStoreUnavailable):
        restore(Recording(target, fail_at=2), data, NS, max_txn_ops=8)  # type: ignore[arg-type]
    source.put(Keys(NS).topic("later"), b"x")
    other, _ = backup(source, NS, now_ms=2)
    # Mixing two backups' keys would be neither: refused, and the first can still finish.
    with pytest.raises(BackupError, match="cut short"):
        restore(target, other, NS, max_txn_ops=8)
    assert restore(target, data, NS, max_txn_ops=8) == "restored 50 keys"


def test_a_restorer_waits_for_the_one_running(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    fill(source)
    data, _ = backup(source, NS)
    running, done = restore_markers(NS)
    other = target.grant_lease(60)
    target.put(running, b"restoring", other.id)  # another pod's init container, mid-restore
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        target.put(done, b"{}")  # ... which then finishes
        other.revoke()

    assert restore(target, data, NS, max_txn_ops=128, wait=wait) == "already restored"
    assert waits == [1.0]


def test_a_restorer_gives_up_on_a_claim_held_too_long(
    source: SqliteMetadataStore, target: SqliteMetadataStore
) -> None:
    fill(source)
    data, _ = backup(source, NS)
    running, _ = restore_markers(NS)
    held = target.grant_lease(60)
    target.put(running, b"restoring", held.id)
    with pytest.raises(BackupError, match="another restore held"):
        restore(target, data, NS, max_txn_ops=128, wait=lambda _: None, deadline_s=-1)
    assert namespace_keys(target) == {}


# --- the command's choice of backups to delete (--keep) ------------------------------------------


def test_keep_deletes_only_the_namespaces_oldest_backups() -> None:
    prefix = "metadata-backups/"
    own = [f"{prefix}{NS}-20261128T10000{n}.000Z.json.gz" for n in range(4)]
    theirs = [  # another cluster whose namespace starts with this one's, same prefix
        f"{prefix}{NS}-eu-20261128T100000.000Z.json.gz",
        f"{prefix}{NS}-eu-20261128T100009.000Z.json.gz",
    ]
    unrelated = [f"{prefix}notes.txt", f"{prefix}sub/{NS}-20261128T100000.000Z.json.gz"]
    listed = sorted(own + theirs + unrelated)
    assert stale_backups(listed, prefix, NS, keep=2) == own[:2]
    assert stale_backups(listed, prefix, NS + "-eu", keep=1) == theirs[:1]
    assert stale_backups(listed, prefix, NS, keep=10) == []


def test_the_command_needs_etcd(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "kafscale"), "metadata", "backup"],
        env={**env, "KAFSCALE_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "KAFSCALE_ETCD_ENDPOINTS is not set" in result.stderr
