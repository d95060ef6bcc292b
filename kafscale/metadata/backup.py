"""Logical backups of one cluster namespace's metadata: every key under ``/kafscale/{ns}/`` at one
revision, and its restore into a store that has none (docs/kubernetes.md, "etcd backup and
restore"; the operator's snapshot CronJob and restore init container run them).

Logical, not etcd's own snapshot file: it needs no etcd binaries beside the broker's image, works
on either backend, and leaves out what must not come back -- keys on a lease (broker
registrations, partition leaders, the chores' holder) belong to processes that are gone, so a
restored cluster starts with every partition unowned and each broker claims its share anew, at a
higher leader epoch (the epochs live in the partition records, which are kept).

A backup is gzip'd JSON lines: a header (format, version, namespace, revision, key count, time),
then one ``{"k": key, "v": base64 value}`` per key. Restoring writes the keys in transactions of
at most ``KAFSCALE_METADATA_MAX_TXN_OPS`` puts and ``KAFSCALE_METADATA_MAX_TXN_BYTES`` bytes; it
is idempotent, so a restore cut short is simply run again. Exactly one of several restorers
running at once does it (the others wait for it): the first to create the lease-held key
``{root}restore/running``. Before its first put it writes ``{root}restore/started`` (which backup),
so a restore run again after being cut short finishes the same backup instead of taking its
partial keys for a cluster's data; the last transaction puts ``{root}restore/done`` (and drops
``started``), after which a restore never runs again for that namespace. Keys under
``{root}restore/`` are never backed up.

A restore loses what the cluster committed after the backup was taken: records acknowledged
after it stay in the bucket but are no longer referenced (the write path's conditional PUTs keep
them from being overwritten). It is for disaster recovery, not undo.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, Delete, MetadataStore, Put

log = logging.getLogger(__name__)

FORMAT = "kafscale-metadata-backup"
VERSION = 1
RESTORE_LEASE_TTL = 15  # seconds the running restorer's claim outlives it
OP_OVERHEAD = 16  # bytes a put costs in an etcd request besides its key and value


class BackupError(Exception):
    """A backup that cannot be read or restored; the message says why."""


@dataclass(frozen=True)
class Header:
    namespace: str
    revision: int
    keys: int
    taken_ms: int


def _restore_dir(namespace: str) -> str:
    return Keys(namespace).root + "restore/"


def restore_markers(namespace: str) -> tuple[str, str]:
    """The keys of a restore in progress (on its restorer's lease) and of one done."""
    directory = _restore_dir(namespace)
    return directory + "running", directory + "done"


def _started_marker(namespace: str) -> str:
    """The key saying which backup a restore began writing (removed when it is done)."""
    return _restore_dir(namespace) + "started"


def backup(store: MetadataStore, namespace: str, now_ms: int | None = None) -> tuple[bytes, Header]:
    """Every key of ``namespace`` not held on a lease, at one revision, as a backup file."""
    root = Keys(namespace).root
    markers = _restore_dir(namespace)
    entries = [
        kv for kv in store.get_prefix(root) if kv.lease_id == 0 and not kv.key.startswith(markers)
    ]
    revision = max((kv.mod_revision for kv in entries), default=0)
    header = Header(namespace, revision, len(entries), now_ms or int(time.time() * 1000))
    lines = [
        json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "namespace": namespace,
                "revision": header.revision,
                "keys": header.keys,
                "taken_ms": header.taken_ms,
            }
        )
    ]
    lines.extend(
        json.dumps({"k": kv.key, "v": base64.b64encode(kv.value).decode()}) for kv in entries
    )
    return gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=6), header


def read(data: bytes) -> tuple[Header, list[tuple[str, bytes]]]:
    """A backup file's header and keys, checked (format, version, count, one namespace)."""
    try:
        text = gzip.decompress(data).decode()
        rows = [json.loads(line) for line in text.splitlines() if line]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupError(f"not a KafScale metadata backup: {exc}") from None
    if not rows or not isinstance(rows[0], dict) or rows[0].get("format") != FORMAT:
        raise BackupError("not a KafScale metadata backup (no header)")
    if rows[0].get("version") != VERSION:
        raise BackupError(f"backup version {rows[0].get('version')} is not {VERSION}")
    try:
        header, entries = _parse(rows[0], rows[1:])
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        # Valid JSON of the wrong shape: a field missing, of the wrong type, not base64.
        raise BackupError(f"a corrupt KafScale metadata backup: {exc!r}") from None
    if len(entries) != header.keys:
        raise BackupError(f"the backup holds {len(entries)} keys, its header says {header.keys}")
    return header, entries


def _parse(first: dict[str, Any], rows: list[Any]) -> tuple[Header, list[tuple[str, bytes]]]:
    namespace = first["namespace"]
    if not isinstance(namespace, str):
        raise TypeError(f"namespace {namespace!r} is not a string")
    header = Header(namespace, int(first["revision"]), int(first["keys"]), int(first["taken_ms"]))
    root = Keys(header.namespace).root
    entries: list[tuple[str, bytes]] = []
    for row in rows:
        key = row["k"]
        if not isinstance(key, str) or not key.startswith(root):
            raise BackupError(f"key {key!r} is outside the backup's namespace {header.namespace!r}")
        entries.append((key, base64.b64decode(row["v"], validate=True)))
    return header, entries


def _batches(
    entries: list[tuple[str, bytes]], max_ops: int, max_bytes: int
) -> Iterator[list[tuple[str, bytes]]]:
    """``entries`` in order, in batches of at most ``max_ops`` puts and ``max_bytes`` bytes
    (0: no byte limit); a key larger than ``max_bytes`` alone is a batch of its own."""
    batch: list[tuple[str, bytes]] = []
    size = 0
    for key, value in entries:
        cost = len(key.encode()) + len(value) + OP_OVERHEAD
        if batch and (len(batch) >= max_ops or (max_bytes and size + cost > max_bytes)):
            yield batch
            batch, size = [], 0
        batch.append((key, value))
        size += cost
    if batch:
        yield batch


def restore(
    store: MetadataStore,
    data: bytes,
    namespace: str,
    max_txn_ops: int,
    wait: Callable[[float], None] = time.sleep,
    deadline_s: float = 600.0,
    max_txn_bytes: int = 0,
) -> str:
    """Restore a backup into ``namespace`` unless it was restored before or holds data.

    Returns what happened: "restored N keys", "already restored", or "not empty". Several
    callers at once (every broker pod's init container) are safe: one restores, the others wait
    until it is done. A restore cut short (its restorer killed, the store lost) finishes when
    run again with the same backup. Raises ``BackupError`` for a backup of another namespace,
    an unreadable one, or one other than the backup a cut-short restore began.
    """
    header, entries = read(data)
    if header.namespace != namespace:
        raise BackupError(
            f"the backup is of namespace {header.namespace!r}, not {namespace!r} (set "
            "KAFSCALE_S3_NAMESPACE to the backed-up cluster's)"
        )
    running, done = restore_markers(namespace)
    started = _started_marker(namespace)
    which = json.dumps(
        {"revision": header.revision, "taken_ms": header.taken_ms, "keys": header.keys},
        sort_keys=True,
    ).encode()
    give_up = time.monotonic() + deadline_s
    while True:
        if store.get(done) is not None:
            return "already restored"
        lease = store.grant_lease(RESTORE_LEASE_TTL)
        claimed = store.transaction(
            [Compare.absent(running)], [Put(running, b"restoring", lease.id)]
        ).succeeded
        if claimed:
            break
        lease.revoke()
        if time.monotonic() > give_up:
            raise BackupError(f"another restore held {running} for {deadline_s:.0f} s")
        wait(1.0)
    try:
        if store.get(done) is not None:
            return "already restored"
        begun = store.get(started)
        if begun is None:
            markers = _restore_dir(namespace)
            present = [
                kv
                for kv in store.get_prefix(Keys(namespace).root)
                if not kv.key.startswith(markers)
            ]
            if present:
                log.warning(
                    "restore skipped: the namespace already holds keys",
                    extra={"namespace": namespace, "keys": len(present)},
                )
                return "not empty"
            store.put(started, which)
        elif begun.value != which:
            raise BackupError(
                f"a restore of another backup ({begun.value.decode(errors='replace')}) was cut "
                f"short in namespace {namespace!r}: run that one again to finish it"
            )
        for batch in _batches(entries, max(1, max_txn_ops), max(0, max_txn_bytes)):
            lease.refresh()
            store.transaction([], [Put(key, value) for key, value in batch])
        marker = json.dumps({"revision": header.revision, "taken_ms": header.taken_ms}).encode()
        store.transaction([], [Put(done, marker), Delete(started)])
        return f"restored {len(entries)} keys"
    finally:
        lease.revoke()
