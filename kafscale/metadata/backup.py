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
at most ``KAFSCALE_METADATA_MAX_TXN_OPS`` puts; it is idempotent, so a restore cut short is simply
run again. Exactly one of several restorers running at once does it (the others wait for it):
the first to create the lease-held key ``{root}restore/running``; the last put is
``{root}restore/done``, after which a restore never runs again for that namespace.

A restore loses what the cluster committed after the backup was taken: records acknowledged
after it stay in the bucket but are no longer referenced (the write path's conditional PUTs keep
them from being overwritten). It is for disaster recovery, not undo.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, MetadataStore, Put

log = logging.getLogger(__name__)

FORMAT = "kafscale-metadata-backup"
VERSION = 1
RESTORE_LEASE_TTL = 15  # seconds the running restorer's claim outlives it


class BackupError(Exception):
    """A backup that cannot be read or restored; the message says why."""


@dataclass(frozen=True)
class Header:
    namespace: str
    revision: int
    keys: int
    taken_ms: int


def restore_markers(namespace: str) -> tuple[str, str]:
    """The keys of a restore in progress (on its restorer's lease) and of one done."""
    root = Keys(namespace).root
    return root + "restore/running", root + "restore/done"


def backup(store: MetadataStore, namespace: str, now_ms: int | None = None) -> tuple[bytes, Header]:
    """Every key of ``namespace`` not held on a lease, at one revision, as a backup file."""
    root = Keys(namespace).root
    running, done = restore_markers(namespace)
    entries = [
        kv for kv in store.get_prefix(root) if kv.lease_id == 0 and kv.key not in (running, done)
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
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupError(f"not a KafScale metadata backup: {exc}") from None
    if not rows or rows[0].get("format") != FORMAT:
        raise BackupError("not a KafScale metadata backup (no header)")
    first = rows[0]
    if first.get("version") != VERSION:
        raise BackupError(f"backup version {first.get('version')} is not {VERSION}")
    header = Header(
        str(first["namespace"]), int(first["revision"]), int(first["keys"]), int(first["taken_ms"])
    )
    root = Keys(header.namespace).root
    entries: list[tuple[str, bytes]] = []
    for row in rows[1:]:
        key = str(row["k"])
        if not key.startswith(root):
            raise BackupError(f"key {key!r} is outside the backup's namespace {header.namespace!r}")
        entries.append((key, base64.b64decode(row["v"])))
    if len(entries) != header.keys:
        raise BackupError(f"the backup holds {len(entries)} keys, its header says {header.keys}")
    return header, entries


def _batches(entries: list[tuple[str, bytes]], size: int) -> Iterator[list[tuple[str, bytes]]]:
    for start in range(0, len(entries), size):
        yield entries[start : start + size]


def restore(
    store: MetadataStore,
    data: bytes,
    namespace: str,
    max_txn_ops: int,
    wait: Callable[[float], None] = time.sleep,
    deadline_s: float = 600.0,
) -> str:
    """Restore a backup into ``namespace`` unless it was restored before or holds data.

    Returns what happened: "restored N keys", "already restored", or "not empty". Several
    callers at once (every broker pod's init container) are safe: one restores, the others wait
    until it is done. Raises ``BackupError`` for a backup of another namespace or unreadable.
    """
    header, entries = read(data)
    if header.namespace != namespace:
        raise BackupError(
            f"the backup is of namespace {header.namespace!r}, not {namespace!r} (set "
            "KAFSCALE_S3_NAMESPACE to the backed-up cluster's)"
        )
    running, done = restore_markers(namespace)
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
        present = [kv for kv in store.get_prefix(Keys(namespace).root) if kv.key != running]
        if present:
            log.warning(
                "restore skipped: the namespace already holds keys",
                extra={"namespace": namespace, "keys": len(present)},
            )
            return "not empty"
        for batch in _batches(entries, max(1, max_txn_ops)):
            lease.refresh()
            store.transaction([], [Put(key, value) for key, value in batch])
        store.put(
            done, json.dumps({"revision": header.revision, "taken_ms": header.taken_ms}).encode()
        )
        return f"restored {len(entries)} keys"
    finally:
        lease.revoke()
