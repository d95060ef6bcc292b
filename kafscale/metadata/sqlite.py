"""SQLite metadata store: the embedded default, one file shared by all processes of one broker.

Keeps the semantics of ``store.MetadataStore`` on a single SQLite file in WAL mode (readers never
block the writer; ``busy_timeout`` queues writers). Invariants:

- Every write is one ``BEGIN IMMEDIATE`` transaction. A write that changes something bumps
  ``meta.revision`` by exactly one and records one ``events`` row per changed key at that
  revision; a write that changes nothing (deleting an absent key) leaves the revision alone, as
  etcd does. Keys are stored as UTF-8 BLOBs so they sort bytewise, like etcd's.
- Only the events of the last ``history_revisions`` revisions are kept; ``meta.compacted`` is the
  highest pruned revision. A watch that needs an event at or below it gets ``RevisionCompacted``
  (raised by ``watch_prefix`` or passed to ``on_error``): never a silent gap.
- Leases are rows (id, ttl, deadline). Deadlines are wall-clock ``time.time()`` because processes
  share no monotonic clock. Expired leases are reaped by whichever process looks first — at the
  start of every write, before reads, and by the watch poller — deleting their keys with DELETE
  events, so the keys of a SIGKILLed lease holder still go away.
- sqlite3 connections are not shared between threads: each thread gets its own. One poller thread
  per store instance (started by the first watch) delivers events to all its watches, in revision
  order, checking the store revision so that an idle store costs two tiny queries per poll; it
  polls every 25 ms while the store changes and every 100 ms once it was quiet for 2 s.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from kafscale.metadata.store import (
    Compare,
    Delete,
    DeleteRange,
    EventType,
    KeyValue,
    LeaseExpired,
    MetadataStoreError,
    MetadataStoreUnavailable,
    Operation,
    Put,
    RevisionCompacted,
    TxnResult,
    WatchEvent,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.025  # while the store changes
# Idle, the poller backs off to this: each poll wakes a thread of every process holding a watch
# (five per broker), most of an idle embedded broker's CPU at 25 ms. A first change after a quiet
# spell is seen up to this late; the next ones at the fast interval again.
IDLE_POLL_INTERVAL_S = 0.1
QUIET_AFTER_S = 2.0  # polls without a change for this long count as idle
BUSY_TIMEOUT_MS = 30_000
DEFAULT_HISTORY_REVISIONS = 10_000

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta VALUES ('revision', 1), ('compacted', 0)",
    "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,"
    " create_revision INTEGER NOT NULL, mod_revision INTEGER NOT NULL,"
    " lease_id INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS kv_by_lease ON kv (lease_id) WHERE lease_id != 0",
    "CREATE TABLE IF NOT EXISTS events (revision INTEGER NOT NULL, seq INTEGER NOT NULL,"
    " deleted INTEGER NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (revision, seq)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL,"
    " deadline REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS leases_by_deadline ON leases (deadline)",
)


def _prefix_where(prefix: str) -> tuple[str, tuple[bytes, ...]]:
    """SQL condition and parameters selecting keys that start with ``prefix`` (bytewise)."""
    start = prefix.encode()
    if not start:
        return "1", ()
    # UTF-8 never contains 0xFF, so bumping the last byte gives the exclusive upper bound.
    end = start[:-1] + bytes([start[-1] + 1])
    return "key >= ? AND key < ?", (start, end)


def _meta(conn: sqlite3.Connection) -> dict[str, int]:
    return {name: value for name, value in conn.execute("SELECT name, value FROM meta")}


def _apply(conn: sqlite3.Connection, ops: Sequence[Operation]) -> int:
    """Apply ``ops`` at the next revision; return the store revision afterwards."""
    revision: int = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0]
    new, seq = revision + 1, 0
    for op in ops:
        if isinstance(op, Put):
            _put(conn, op, new, seq)
            seq += 1
        else:
            for key in _keys_deleted(conn, op):
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
                conn.execute("INSERT INTO events VALUES (?, ?, 1, ?, X'')", (new, seq, key))
                seq += 1
    if not seq:
        return revision
    conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (new,))
    return new


def _put(conn: sqlite3.Connection, op: Put, revision: int, seq: int) -> None:
    if (
        op.lease_id
        and not conn.execute("SELECT 1 FROM leases WHERE id = ?", (op.lease_id,)).fetchone()
    ):
        raise LeaseExpired(f"lease {op.lease_id:x} expired or was revoked")
    key = op.key.encode()
    row = conn.execute("SELECT create_revision FROM kv WHERE key = ?", (key,)).fetchone()
    conn.execute(
        "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?)",
        (key, op.value, row[0] if row else revision, revision, op.lease_id),
    )
    conn.execute("INSERT INTO events VALUES (?, ?, 0, ?, ?)", (revision, seq, key, op.value))


def _keys_deleted(conn: sqlite3.Connection, op: Delete | DeleteRange) -> list[bytes]:
    """The existing keys ``op`` deletes, in key order (one DELETE event each, as etcd sends)."""
    params: tuple[bytes, ...]
    if isinstance(op, Delete):
        where, params = "key = ?", (op.key.encode(),)
    else:
        where, params = "key >= ? AND key < ?", (op.start.encode(), op.end.encode())
    rows = conn.execute(f"SELECT key FROM kv WHERE {where} ORDER BY key", params).fetchall()
    return [bytes(key) for (key,) in rows]


def _revoke(conn: sqlite3.Connection, lease_id: int) -> None:
    keys = conn.execute("SELECT key FROM kv WHERE lease_id = ? ORDER BY key", (lease_id,))
    _apply(conn, [Delete(bytes(key).decode()) for (key,) in keys.fetchall()])
    conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))


def _reap_expired(conn: sqlite3.Connection, now: float) -> None:
    for (lease_id,) in conn.execute(
        "SELECT id FROM leases WHERE deadline <= ? ORDER BY deadline", (now,)
    ).fetchall():
        log.info("lease %x expired; deleting its keys", lease_id)
        _revoke(conn, lease_id)


def _compare_holds(conn: sqlite3.Connection, compare: Compare) -> bool:
    if compare.mod_revision is None and compare.value is None:
        raise ValueError(f"{compare!r} gives neither mod_revision nor value")
    row = conn.execute(
        "SELECT mod_revision, value FROM kv WHERE key = ?", (compare.key.encode(),)
    ).fetchone()
    if compare.mod_revision is not None and (row[0] if row else 0) != compare.mod_revision:
        return False
    return compare.value is None or (row is not None and bytes(row[1]) == compare.value)


def _check_distinct_keys(ops: Sequence[Operation]) -> None:
    """Refuse what etcd refuses ("duplicate key given in txn request"): a key put or deleted
    twice, or put inside a range the same branch deletes."""
    keys = [op.key for op in ops if not isinstance(op, DeleteRange)]
    if len(set(keys)) != len(keys):
        raise MetadataStoreError(f"a transaction branch touches a key twice: {keys}")
    for deleted in (op for op in ops if isinstance(op, DeleteRange)):
        for put in (op for op in ops if isinstance(op, Put)):
            if deleted.start <= put.key < deleted.end:
                raise MetadataStoreError(
                    f"a transaction branch puts {put.key} inside the range it deletes"
                    f" [{deleted.start}, {deleted.end})"
                )


class SqliteLease:
    def __init__(self, store: SqliteMetadataStore, lease_id: int, ttl: int) -> None:
        self._store, self._id, self._ttl = store, lease_id, ttl

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> int:
        return self._ttl

    def refresh(self) -> None:
        with self._store._write() as conn:
            refreshed = conn.execute(
                "UPDATE leases SET deadline = ? WHERE id = ?", (time.time() + self._ttl, self._id)
            ).rowcount
        if not refreshed:
            raise LeaseExpired(f"lease {self._id:x} expired or was revoked")

    def revoke(self) -> None:
        with self._store._write() as conn:
            _revoke(conn, self._id)


class SqliteWatch:
    def __init__(
        self,
        store: SqliteMetadataStore,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        on_error: Callable[[MetadataStoreError], None] | None,
        after: int,
    ) -> None:
        self.prefix, self.after = prefix, after
        self._store, self._callback, self._on_error = store, callback, on_error
        self._delivering = threading.Lock()
        self.cancelled = False
        self.error: MetadataStoreError | None = None

    def cancel(self) -> None:
        self.cancelled = True
        with self._store._lock:
            self._store._watches.discard(self)
        if threading.current_thread() is not self._store._poller:
            with self._delivering:  # wait out a delivery in progress: none runs after we return
                pass

    def _deliver(self, events: list[WatchEvent], revision: int) -> None:
        with self._delivering:
            for event in events:
                if self.cancelled:
                    return
                try:
                    self._callback(event)
                except Exception:
                    log.exception("watch callback on %r failed", self.prefix)
            self.after = revision

    def _fail(self, error: MetadataStoreError) -> None:
        self.error = error
        self.cancel()
        if self._on_error is None:
            log.error("watch on %r ended: %s", self.prefix, error)
        else:
            try:
                self._on_error(error)
            except Exception:
                log.exception("on_error of the watch on %r failed", self.prefix)


class SqliteMetadataStore:
    def __init__(self, path: str, history_revisions: int = DEFAULT_HISTORY_REVISIONS) -> None:
        self._path = path
        self._history = history_revisions
        self._pid = os.getpid()
        self._local = threading.local()
        self._connections: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._watches: set[SqliteWatch] = set()
        self._poller: threading.Thread | None = None
        self._closed = threading.Event()
        with self._errors():
            conn = self._conn()
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                raise MetadataStoreUnavailable(f"SQLite metadata at {path} cannot use WAL mode")
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute("COMMIT")

    @property
    def description(self) -> str:
        return self._path

    # -- connections and transactions --------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:
            raise MetadataStoreError("a SqliteMetadataStore cannot cross fork(); open a new one")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self._path,
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = FULL")  # a committed high watermark must survive
            self._local.conn = conn
            with self._lock:  # also close the connections of threads that have ended
                for thread in [t for t in self._connections if not t.is_alive()]:
                    self._connections.pop(thread).close()
                self._connections[threading.current_thread()] = conn
        return conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:  # cannot open, locked past busy_timeout, I/O
            raise MetadataStoreUnavailable(
                f"SQLite metadata at {self._path} is unavailable: {exc}"
            ) from exc
        except sqlite3.Error as exc:
            raise MetadataStoreError(f"SQLite metadata at {self._path}: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: reap expired leases, then run the body in a savepoint, so a
        failing body (say, a put on an expired lease) is undone but the reaping is kept."""
        with self._errors():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                _reap_expired(conn, time.time())
                conn.execute("SAVEPOINT body")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK TO body")
                    raise
                finally:
                    self._prune(conn)
                    conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    def _prune(self, conn: sqlite3.Connection) -> None:
        meta = _meta(conn)
        cutoff = meta["revision"] - self._history
        if cutoff > meta["compacted"]:
            conn.execute("DELETE FROM events WHERE revision <= ?", (cutoff,))
            conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (cutoff,))

    def _reap_if_due(self) -> None:
        with self._errors():
            due = (
                self._conn()
                .execute("SELECT 1 FROM leases WHERE deadline <= ? LIMIT 1", (time.time(),))
                .fetchone()
            )
        if due:
            with self._write():
                pass

    # -- key-value -----------------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        self._reap_if_due()
        with self._errors():
            row = (
                self._conn()
                .execute(
                    "SELECT key, value, create_revision, mod_revision, lease_id FROM kv"
                    " WHERE key = ?",
                    (key.encode(),),
                )
                .fetchone()
            )
        return None if row is None else _key_value(row)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        self._reap_if_due()
        where, params = _prefix_where(prefix)
        with self._errors():
            rows = (
                self._conn()
                .execute(
                    "SELECT key, value, create_revision, mod_revision, lease_id FROM kv"
                    f" WHERE {where} ORDER BY key",
                    params,
                )
                .fetchall()
            )
        return [_key_value(row) for row in rows]

    def revision(self) -> int:
        self._reap_if_due()
        with self._errors():
            return _meta(self._conn())["revision"]

    def compact(self, revision: int) -> None:
        """Nothing to do: only the last ``history_revisions`` revisions are ever kept."""

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        with self._write() as conn:
            return _apply(conn, [Put(key, value, lease_id)])

    def delete(self, key: str) -> bool:
        with self._write() as conn:
            before = _meta(conn)["revision"]
            return _apply(conn, [Delete(key)]) != before

    def transaction(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        _check_distinct_keys(success)
        _check_distinct_keys(failure)
        with self._write() as conn:
            succeeded = all(_compare_holds(conn, compare) for compare in compares)
            return TxnResult(succeeded, _apply(conn, success if succeeded else failure))

    # -- leases ----------------------------------------------------------------------------------

    def grant_lease(self, ttl_seconds: int) -> SqliteLease:
        if ttl_seconds < 1:
            raise ValueError(f"a lease needs a ttl of at least 1 second, got {ttl_seconds}")
        with self._write() as conn:
            while True:
                lease_id = secrets.randbits(63) or 1
                if conn.execute(
                    "INSERT OR IGNORE INTO leases VALUES (?, ?, ?)",
                    (lease_id, ttl_seconds, time.time() + ttl_seconds),
                ).rowcount:
                    return SqliteLease(self, lease_id, ttl_seconds)

    # -- watches ---------------------------------------------------------------------------------

    def watch_prefix(
        self,
        prefix: str,
        callback: Callable[[WatchEvent], None],
        start_revision: int | None = None,
        on_error: Callable[[MetadataStoreError], None] | None = None,
    ) -> SqliteWatch:
        with self._errors():
            meta = _meta(self._conn())
        after = meta["revision"] if start_revision is None else start_revision
        if after < meta["compacted"]:
            raise self._compacted(prefix, after, meta["compacted"])
        watch = SqliteWatch(self, prefix, callback, on_error, after)
        with self._lock:
            if self._closed.is_set():
                raise MetadataStoreError(f"SQLite metadata at {self._path} is closed")
            self._watches.add(watch)
            if self._poller is None:
                self._poller = threading.Thread(
                    target=self._poll, daemon=True, name=f"sqlite-watch {self._path}"
                )
                self._poller.start()
        return watch

    def _compacted(self, prefix: str, after: int, compacted: int) -> RevisionCompacted:
        return RevisionCompacted(
            f"watch on {prefix!r} needs events after revision {after}, but SQLite metadata at"
            f" {self._path} keeps only those after {compacted}",
            compacted,
        )

    def _poll(self) -> None:
        failing = False
        interval, changed_at, seen = POLL_INTERVAL_S, time.monotonic(), -1
        while not self._closed.wait(interval):
            try:
                self._reap_if_due()
                with self._errors():
                    revision = self._deliver_pending()
                now = time.monotonic()
                if revision != seen:
                    seen, changed_at = revision, now
                quiet = now - changed_at >= QUIET_AFTER_S
                interval = IDLE_POLL_INTERVAL_S if quiet else POLL_INTERVAL_S
            except Exception as exc:  # a dead poller would stall every watch: keep going
                if not failing:
                    log.warning(
                        "watch poller of %s failed: %r (retrying)",
                        self._path,
                        exc,
                        exc_info=not isinstance(exc, MetadataStoreError),
                    )
                failing = True
            else:
                failing = False

    def _deliver_pending(self) -> int:
        """Deliver the events each watch has not seen; returns the store's revision."""
        conn = self._conn()
        revision: int = _meta(conn)["revision"]
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            if watch.after >= revision or watch.cancelled:
                continue
            where, params = _prefix_where(watch.prefix)
            conn.execute("BEGIN")  # one snapshot: the compaction check and the events agree
            try:
                compacted = _meta(conn)["compacted"]
                rows = conn.execute(
                    f"SELECT revision, deleted, key, value FROM events WHERE {where}"
                    " AND revision > ? AND revision <= ? ORDER BY revision, seq",
                    (*params, watch.after, revision),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            if watch.after < compacted:
                watch._fail(self._compacted(watch.prefix, watch.after, compacted))
                continue
            watch._deliver(
                [
                    WatchEvent(
                        EventType.DELETE if deleted else EventType.PUT,
                        bytes(key).decode(),
                        bytes(value),
                        rev,
                    )
                    for rev, deleted, key, value in rows
                ],
                revision,
            )
        return revision

    # -- lifecycle -------------------------------------------------------------------------------

    def check(self) -> None:
        with self._errors():
            _meta(self._conn())

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.cancel()
        poller = self._poller
        if poller is not None and poller is not threading.current_thread():
            poller.join()
        with self._lock:
            connections, self._connections = self._connections, {}
        for conn in connections.values():
            conn.close()


def _key_value(row: tuple[bytes, bytes, int, int, int]) -> KeyValue:
    key, value, create_revision, mod_revision, lease_id = row
    return KeyValue(bytes(key).decode(), bytes(value), create_revision, mod_revision, lease_id)
