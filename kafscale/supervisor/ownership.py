"""The store lock: one broker, and only one, writes a store that cannot be shared.

A store is a namespace (``KAFSCALE_S3_NAMESPACE``) of one metadata store plus the objects it
describes. On etcd and S3 any number of brokers share one: each partition has one fenced owner
(docs/design/scale-out.md), and there is no store lock. A store with a local side -- SQLite
metadata or objects in the data directory -- can only be one machine's, so there the supervisor
takes the store lock before any child boots, holds it for the broker's life, and releases it on a
clean shutdown (after every child stopped): a second broker there would find partitions it can
claim but objects it cannot read.

- **The metadata lock** (``StoreLock``): the key ``/kafscale/{ns}/owner``, created put-if-absent
  in one transaction and attached to a lease of ``KAFSCALE_STORE_LOCK_TTL_MS`` (whole seconds)
  that a thread of the supervisor refreshes every third of it. Its value (``OwnerRecord``) names
  the holder -- broker id, host, pid, advertised address, metrics port, run id, start time -- so
  that a refused broker can say who holds the store.
- **A crashed holder.** A SIGKILLed broker cannot release: its lease runs out within its TTL. A
  broker that finds the lock held therefore waits up to the holder's TTL (+2 s) for it to go,
  saying so in one log line, and refuses to start, naming the holder, if it does not. So a pod
  Kubernetes restarts after a crash takes the lock at most one TTL (+2 s) after the crash and
  then boots as usual. It never takes over a
  lock that is still held, even one that looks like its own (same broker id and host): nothing in
  the record proves its writer dead -- two processes on one host share the host name, a
  container's supervisor is pid 1 every time, a pod IP is reused -- and taking over a live
  broker's lock is the very corruption this prevents. A TTL is the price: keep it short, and
  below the liveness probe's failure window (the metrics port opens only after the lock).
- **Outages.** etcd does not expire leases while it is down, and re-arms every lease's TTL when
  it restarts or elects a new leader, so an etcd outage costs the lock nothing. The keeper
  retries a failed refresh every second and, after every refresh, re-reads the key: still ours
  (our lease) -- carry on; gone (the lease lapsed, say etcd was paused longer than the TTL) --
  take it again; held by another broker -- the lock is lost: ``on_lost`` is called with a
  message naming the new holder, and the supervisor stops at once without a drain. Writes of a
  broker that lost its lock are fenced by the partition leader keys on its broker lease
  (``kafscale.supervisor.membership``), which the same lapse ended.
- **Embedded backends** (``DataDirLock``): an exclusive ``flock`` on ``{data_dir}/broker.lock``
  whenever the data directory holds state (SQLite metadata or local segments). The OS releases
  it when the last process holding it exits -- the fd is inherited by every child, so children
  still draining after a SIGKILLed supervisor keep it -- and the file holds the holder's
  ``OwnerRecord`` for the refusal message. With SQLite metadata in that directory, holding the
  flock proves that any ``owner`` key found there, and any broker registration or partition
  leader key, is a dead broker's: the key is taken over and the others are deleted at once, so a
  restart after a crash waits for no lease.

Broker registration (``kafscale.supervisor.membership``) is put-if-absent too: two brokers never
share a node id, on any store.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import msgspec

from kafscale.config import Config
from kafscale.metadata.records import Keys
from kafscale.metadata.store import (
    Compare,
    Delete,
    KeyValue,
    Lease,
    LeaseExpired,
    MetadataStore,
    MetadataStoreError,
    Put,
    put_if_absent,
)
from kafscale.supervisor.datadir_lock import DataDirLock

log = logging.getLogger(__name__)

WAIT_MARGIN_S = 2.0  # past the holder's TTL: etcd checks lease expiry every 500 ms
POLL_INTERVAL_S = 0.5
RETRY_INTERVAL_S = 1.0


class StoreLocked(Exception):
    """Another broker holds the store; the message names it."""


class OwnerRecord(msgspec.Struct, frozen=True):
    """Who holds a store: the value of the ``owner`` key and the content of the lock file."""

    broker_id: int
    host: str  # the machine (the pod's name in Kubernetes)
    pid: int  # of the supervisor
    advertised: str  # host:port clients connect to
    metrics_port: int
    run_id: str
    started_ms: int
    lease_ttl_s: int = 0

    def describe(self) -> str:
        since = datetime.datetime.fromtimestamp(self.started_ms / 1000, datetime.UTC)
        return (
            f"broker {self.broker_id} (pid {self.pid} on {self.host}, Kafka {self.advertised}, "
            f"metrics port {self.metrics_port}, run {self.run_id}, "
            f"since {since.isoformat(timespec='seconds')})"
        )


def owner_record(config: Config, run_id: str, lease_ttl_s: int) -> OwnerRecord:
    return OwnerRecord(
        broker_id=config.broker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        advertised=(
            f"{config.primary_listener.advertised_host}:{config.primary_listener.advertised_port}"
        ),
        metrics_port=config.metrics_port,
        run_id=run_id,
        started_ms=int(time.time() * 1000),
        lease_ttl_s=lease_ttl_s,
    )


def decode_owner(value: bytes) -> OwnerRecord | None:
    try:
        return msgspec.json.decode(value, type=OwnerRecord)
    except msgspec.DecodeError:
        return None


def describe_owner(value: bytes) -> str:
    owner = decode_owner(value)
    return owner.describe() if owner is not None else f"an unknown holder ({value[:200]!r})"


class Holding(enum.Enum):
    MINE = "mine"
    FREE = "free"
    TAKEN = "taken"


def judge(key: KeyValue | None, lease_id: int | None) -> Holding:
    """Whose the lock is, given the key as read and our live lease (None: it expired)."""
    if key is None:
        return Holding.FREE
    if lease_id is not None and key.lease_id == lease_id:
        return Holding.MINE
    return Holding.TAKEN


class LockLost(Exception):
    """The lock is held by another broker now; the message names it."""


class StoreLock:
    """The exclusive lease on ``/kafscale/{namespace}/owner``; see the module docstring."""

    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        record: OwnerRecord,
        ttl_s: int,
        *,
        holder_is_dead: bool = False,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.key = self.keys.owner
        self.record = record
        self.ttl_s = ttl_s
        self.holder_is_dead = holder_is_dead  # a found key is a dead broker's (flock proves it)
        self.lease: Lease | None = None
        self.lost: str | None = None  # why the lock was lost, if it was
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def value(self) -> bytes:
        return msgspec.json.encode(self.record)

    def acquire(self) -> None:
        """Take the lock, waiting up to the holder's TTL for a crashed holder's lease to run out.
        Raises ``StoreLocked`` naming a holder that keeps it, ``MetadataStoreError``."""
        lease = self.store.grant_lease(self.ttl_s)
        self.record = msgspec.structs.replace(self.record, lease_ttl_s=lease.ttl)
        try:
            self._acquire(lease)
        except BaseException:
            revoke_quietly(lease)
            raise
        self.lease = lease
        log.info("store lock taken", extra={"key": self.key, "lease_ttl_s": lease.ttl})
        if self.holder_is_dead:
            self._delete_dead_registrations()

    def _delete_dead_registrations(self) -> None:
        """Before we join, every registration found is a dead broker's, and so is every key
        on its lease: the leader keys of its partitions and the chores key (left until the
        lease ran out, they would keep this broker from claiming anything until then)."""
        for kv in self.store.get_prefix(self.keys.brokers):
            if self.store.transaction(
                [Compare(kv.key, mod_revision=kv.mod_revision)], [Delete(kv.key)]
            ).succeeded:
                log.info("deleted the registration of a broker that is gone", extra={"key": kv.key})
        chores = self.store.get(self.keys.chores)
        leased = [*self.store.get_prefix(self.keys.leaders), *([chores] if chores else [])]
        for found in leased:
            self.store.transaction(
                [Compare(found.key, mod_revision=found.mod_revision)], [Delete(found.key)]
            )

    def _acquire(self, lease: Lease) -> None:
        deadline: float | None = None
        while True:
            holder = put_if_absent(self.store, self.key, self.value, lease.id)
            if holder is None:
                return
            if self.holder_is_dead:
                if self._replace(holder, lease):
                    log.warning(
                        "took over the store lock of a broker that is gone",
                        extra={"key": self.key, "holder": describe_owner(holder.value)},
                    )
                    return
                continue
            owner = decode_owner(holder.value)
            now = time.monotonic()
            if deadline is None:
                ttl = owner.lease_ttl_s if owner and owner.lease_ttl_s else self.ttl_s
                wait_s = ttl + WAIT_MARGIN_S
                deadline = now + wait_s
                log.warning(
                    "the store is locked by another broker; waiting up to %.0f s for its lease "
                    "to run out (a crashed broker's does, a running broker's never)",
                    wait_s,
                    extra={"key": self.key, "holder": describe_owner(holder.value)},
                )
            elif now > deadline:
                raise StoreLocked(
                    f"{self.key} in {self.store.description} is held by "
                    f"{describe_owner(holder.value)}: one store, one broker, until scale-out "
                    "lands (stop that broker, or give this one another KAFSCALE_S3_NAMESPACE)"
                )
            lease.refresh()  # waiting may outlast our own lease's TTL
            time.sleep(POLL_INTERVAL_S)

    def _replace(self, holder: KeyValue, lease: Lease) -> bool:
        return self.store.transaction(
            [Compare(self.key, mod_revision=holder.mod_revision)],
            [Put(self.key, self.value, lease.id)],
        ).succeeded

    # -- holding ---------------------------------------------------------------------------------

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Refresh and re-validate the lock on a thread until ``release``; ``on_lost`` (called on
        that thread, once) when another broker holds it."""
        self._thread = threading.Thread(
            target=self._keep, args=(on_lost,), name="store-lock", daemon=True
        )
        self._thread.start()

    def _keep(self, on_lost: Callable[[str], None]) -> None:
        failing = False
        while not self._stop.wait(RETRY_INTERVAL_S if failing else self.ttl_s / 3):
            try:
                self.check()
            except LockLost as exc:
                self.lost = str(exc)
                log.critical("store lock lost", extra={"key": self.key, "reason": self.lost})
                on_lost(self.lost)
                return
            except MetadataStoreError as exc:
                if not failing:
                    log.warning(
                        "cannot refresh the store lock; retrying every second",
                        extra={"key": self.key, "error": str(exc)},
                    )
                failing = True
            except Exception:  # a dead keeper would let the lease lapse unseen: keep going
                log.exception("store lock keeper failed; retrying")
                failing = True
            else:
                if failing:
                    log.info("store lock confirmed after an outage", extra={"key": self.key})
                failing = False

    def check(self) -> None:
        """Refresh the lease and make sure the key is still ours; take it again if it lapsed.
        Raises ``LockLost`` naming the new holder, ``MetadataStoreError`` on an outage."""
        lease = self.lease
        if lease is not None:
            try:
                lease.refresh()
            except LeaseExpired:
                lease = None
        current = self.store.get(self.key)
        verdict = judge(current, lease.id if lease is not None else None)
        if verdict is Holding.MINE:
            return
        if verdict is Holding.TAKEN:
            assert current is not None
            raise LockLost(
                f"{self.key} in {self.store.description} is now held by "
                f"{describe_owner(current.value)}; this broker stops writing"
            )
        if lease is None:
            lease = self.store.grant_lease(self.ttl_s)
            self.lease = lease
        holder = put_if_absent(self.store, self.key, self.value, lease.id)
        if holder is not None and holder.lease_id != lease.id:
            raise LockLost(
                f"{self.key} in {self.store.description} lapsed and was taken by "
                f"{describe_owner(holder.value)}; this broker stops writing"
            )
        log.warning(
            "the store lock had lapsed (the metadata store was unreachable for longer than its "
            "TTL?); it was free and is held again",
            extra={"key": self.key},
        )

    def release(self) -> None:
        """Stop refreshing and end the lease (its key goes with it). Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self.lease is not None:
            revoke_quietly(self.lease)
            self.lease = None


def revoke_quietly(lease: Lease) -> None:
    """End ``lease`` now; if the store fails, it runs out by itself within its TTL."""
    try:
        lease.revoke()
    except MetadataStoreError as exc:
        log.warning("cannot revoke a lease", extra={"lease": f"{lease.id:x}", "error": str(exc)})


class Ownership:
    """The locks of one broker: the data directory's (if it holds state) and the store's (if
    the store cannot be shared); neither on etcd + S3."""

    def __init__(self, store_lock: StoreLock | None, dir_lock: DataDirLock | None) -> None:
        self.store_lock = store_lock
        self.dir_lock = dir_lock

    @property
    def lost(self) -> str | None:
        return self.store_lock.lost if self.store_lock is not None else None

    def keep(self, on_lost: Callable[[str], None]) -> None:
        if self.store_lock is not None:
            self.store_lock.keep(on_lost)

    def release(self) -> None:
        if self.store_lock is not None:
            self.store_lock.release()
        if self.dir_lock is not None:
            self.dir_lock.release()


def acquire(config: Config, store: MetadataStore, run_id: str) -> Ownership:
    """Take this broker's locks, in order: the data directory, then the store.

    Raises ``StoreLocked`` (naming the holder) or ``MetadataStoreError``."""
    if config.uses_s3 and config.uses_etcd:
        return Ownership(None, None)  # shared by design: partitions are fenced one by one
    ttl_s = config.store_lock_ttl_s
    record = owner_record(config, run_id, ttl_s)
    dir_lock = DataDirLock(config.data_dir)  # not etcd + S3: the data directory holds state
    holder = dir_lock.acquire(msgspec.json.encode(record))
    if holder is not None:
        raise StoreLocked(
            f"the data directory {os.path.abspath(config.data_dir)} is in use by "
            f"{describe_owner(holder)}{_gone(holder)}: one data directory, one broker"
        )
    store_lock = StoreLock(
        store, config.s3_namespace, record, ttl_s, holder_is_dead=not config.uses_etcd
    )
    try:
        store_lock.acquire()
    except BaseException:
        dir_lock.release()
        raise
    return Ownership(store_lock, dir_lock)


def _gone(holder: bytes) -> str:
    """A note when the holder's supervisor is known to have exited (same host, no such pid)."""
    owner = decode_owner(holder)
    if owner is None or owner.host != socket.gethostname() or owner.pid <= 0:
        return ""
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return f" -- pid {owner.pid} has exited; processes it started still hold the lock"
    except PermissionError:
        pass
    return ""
