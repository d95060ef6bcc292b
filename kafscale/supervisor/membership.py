"""This broker's membership of the cluster: its lease and its registration, held by the supervisor.

docs/design/scale-out.md, section 3. The supervisor grants the **broker lease** before any child
boots, registers ``brokers/{id}`` on it, refreshes it from a thread every third of its TTL and
revokes it last, after every child stopped. Children get its id (``ChildContext.lease_id``) and
put what only lives while this broker does on it: the leader keys of the partitions it owns. A
child that crashes and is respawned therefore costs the broker none of its partitions; the lease
ends only when the broker does (or stops refreshing it: SIGSTOP, cut off from etcd past the TTL).

Invariants:

- Registration is put-if-absent: two brokers never share a node id. A registration left by a
  broker that crashed (another ``run_id``) is waited out, up to the TTL (+2 s), as KRaft makes a
  broker with a duplicate id wait for the old session to time out; a live holder is refused with
  ``BrokerIdTaken`` naming it. With ``KAFSCALE_BROKER_ID=auto`` the lowest id nobody holds is
  taken instead.
- The keeper retries a failed refresh every second (etcd down does not expire leases: etcd re-arms
  them when it comes back). A lease found gone (``LeaseExpired``) is lost for good: every key on
  it went with it and other brokers may own our partitions at higher epochs by now, so
  ``on_lost`` is called once; the supervisor stops this broker's children without a drain and
  joins again with a new ``Membership`` (``kafscale.supervisor.broker``).
- The registration says ``ready=False`` until every child of the broker serves; ``set_ready``
  then rewrites it (the keeper retries while the store refuses), and only then do other brokers
  hand partitions over to us (``coordinator.owner_state``). ``set_draining`` rewrites it so other
  brokers stop assigning partitions to us while we hand ours over. Both are compare-and-set on
  our own value, on the same lease, one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import msgspec

from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys
from kafscale.metadata.store import (
    Compare,
    Lease,
    LeaseExpired,
    MetadataStore,
    MetadataStoreError,
    Put,
    put_if_absent,
)
from kafscale.supervisor.ownership import (
    POLL_INTERVAL_S,
    RETRY_INTERVAL_S,
    WAIT_MARGIN_S,
    revoke_quietly,
)

log = logging.getLogger(__name__)

AUTO_ID_LIMIT = 10_000  # ids tried by KAFSCALE_BROKER_ID=auto before giving up


class BrokerIdTaken(Exception):
    """Another broker (another run) is registered under this broker's node id."""


class Membership:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        broker: BrokerRecord,
        ttl_s: int,
        auto_id: bool = False,
    ) -> None:
        if not broker.run_id:
            raise ValueError("a BrokerRecord to register needs the run_id of this broker")
        self.store = store
        self.keys = Keys(namespace)
        self.broker = broker
        self.ttl_s = ttl_s
        self.auto_id = auto_id
        self.lease: Lease | None = None
        self.lost: str | None = None  # why the lease was lost, once it was
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting_logged = False
        self._ready_wanted = False
        self._writing = threading.Lock()  # set_ready (keeper thread) and set_draining (main)

    @property
    def node_id(self) -> int:
        return self.broker.node_id

    @property
    def lease_id(self) -> int:
        if self.lease is None:
            raise RuntimeError("not joined")
        return self.lease.id

    def join(self) -> None:
        """Grant the lease and register on it. Raises ``BrokerIdTaken`` (an id held by another
        run, still after its TTL) or ``MetadataStoreError``."""
        lease = self.store.grant_lease(self.ttl_s)
        try:
            if self.auto_id:
                self._register_lowest_free(lease)
            else:
                deadline = time.monotonic() + self.ttl_s + WAIT_MARGIN_S
                while not self._register(lease, waiting=time.monotonic() < deadline):
                    lease.refresh()  # the wait outlasts a third of our own lease's TTL
                    time.sleep(POLL_INTERVAL_S)
        except BaseException:
            revoke_quietly(lease)
            raise
        self.lease = lease
        log.info(
            "registered",
            extra={"node_id": self.broker.node_id, "lease": f"{lease.id:x}", "ttl_s": self.ttl_s},
        )

    def _register_lowest_free(self, lease: Lease) -> None:
        for node_id in range(AUTO_ID_LIMIT):
            candidate = msgspec.structs.replace(self.broker, node_id=node_id)
            if (
                put_if_absent(
                    self.store, self.keys.broker(node_id), records.encode(candidate), lease.id
                )
                is None
            ):
                self.broker = candidate
                return
        raise BrokerIdTaken(f"no free broker id below {AUTO_ID_LIMIT}")

    def _register(self, lease: Lease, waiting: bool) -> bool:
        """Register on ``lease``: True if done, False if another run holds the id and we are
        ``waiting`` for its lease to run out (else ``BrokerIdTaken``)."""
        key, value = self.keys.broker(self.broker.node_id), records.encode(self.broker)
        existing = put_if_absent(self.store, key, value, lease.id)
        if existing is None:
            return True
        holder = _decode(existing.value)
        holder_text = _describe(holder, existing.value)
        taken = f"broker id {self.broker.node_id} is registered at {key} by {holder_text}"
        if not waiting:
            raise BrokerIdTaken(
                f"{taken}; two brokers cannot share a node id (KAFSCALE_BROKER_ID) on one namespace"
            )
        if not self._waiting_logged:
            log.warning(
                "%s; waiting up to %d s for its lease to run out (a crashed broker's does, a "
                "running broker's never)",
                taken,
                self.ttl_s + WAIT_MARGIN_S,
            )
            self._waiting_logged = True
        return False

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Refresh the lease from a thread until ``leave``; ``on_lost`` once if it is lost."""
        self._thread = threading.Thread(
            target=self._keep, args=(on_lost,), name="broker-lease", daemon=True
        )
        self._thread.start()

    def _keep(self, on_lost: Callable[[str], None]) -> None:
        assert self.lease is not None
        interval = max(self.ttl_s / 3, 0.5)
        while not self._stop.wait(interval):
            try:
                self.lease.refresh()
                interval = max(self.ttl_s / 3, 0.5)
                if self._ready_wanted and not self.broker.ready:
                    self.set_ready()
            except LeaseExpired:
                self.lost = (
                    f"the broker lease {self.lease.id:x} expired (not refreshed within "
                    f"{self.ttl_s} s): its partitions may be other brokers' now"
                )
                log.critical("broker lease lost", extra={"reason": self.lost})
                on_lost(self.lost)
                return
            except MetadataStoreError as exc:
                log.warning("cannot refresh the broker lease; retrying", extra={"error": str(exc)})
                interval = RETRY_INTERVAL_S

    def set_ready(self) -> bool:
        """Tell the cluster every process of ours serves; False if the store refused (the keeper
        tries again at its next refresh)."""
        self._ready_wanted = True
        return self._update("ready", ready=True)

    def set_draining(self) -> bool:
        """Tell the cluster we are handing our partitions over; False if the store refused."""
        return self._update("draining", draining=True)

    def _update(self, what: str, **changes: bool) -> bool:
        with self._writing:
            lease = self.lease
            if lease is None:
                return False
            if all(getattr(self.broker, name) == value for name, value in changes.items()):
                return True
            key = self.keys.broker(self.broker.node_id)
            updated = msgspec.structs.replace(self.broker, **changes)
            try:
                done = self.store.transaction(
                    [Compare(key, value=records.encode(self.broker))],
                    [Put(key, records.encode(updated), lease.id)],
                ).succeeded
            except MetadataStoreError as exc:
                log.error("cannot mark this broker %s", what, extra={"error": str(exc)})
                return False
            if done:
                self.broker = updated
            else:
                log.error("cannot mark this broker %s: its registration changed", what)
            return done

    def leave(self) -> None:
        """Stop refreshing and revoke the lease: the registration and every key on it go."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.lease is not None and self.lost is None:
            revoke_quietly(self.lease)
        self.lease = None


def _decode(value: bytes) -> BrokerRecord | None:
    try:
        return records.decode_broker(value)
    except msgspec.DecodeError:
        return None


def _describe(holder: BrokerRecord | None, value: bytes) -> str:
    if holder is None:
        return f"an undecodable record {value[:200]!r}"
    run = holder.run_id or "unknown"
    return f"a broker at {holder.host}:{holder.port} (run {run})"
