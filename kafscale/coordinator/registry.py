"""The coordinator's cluster bookkeeping: the cluster id and this broker's registration.

The cluster id is created once with a put-if-absent transaction, so brokers racing to start a new
cluster agree on one. The broker's record ``/brokers/{id}`` is attached to a lease that the
coordinator keeps alive; when the broker stops (or dies and the lease runs out), its record
disappears. Invariants:

- Registration is put-if-absent: a broker never overwrites another broker's registration, so two
  brokers can never share a node id. The one exception is a registration of this same
  ``kafscale serve`` run (``BrokerRecord.run_id``): a coordinator that crashed and was respawned
  replaces the record its predecessor left, whose lease has not run out yet.
- A registration held by another run is waited out at boot, up to the registration TTL (+2 s):
  a broker that crashed leaves its record until its lease runs out, and a restart must not fail
  for it (KRaft makes a broker with a duplicate id retry the same way until the old session
  times out). If it is still there, or if another run took the id while our lease had lapsed,
  ``BrokerIdTaken`` names the holder. It is not a ``MetadataStoreError``: it is a configuration
  error, not an outage, and must stop the coordinator rather than be retried. With the store
  lock (``kafscale.supervisor.ownership``) it cannot happen within a namespace unless the lock's
  holder stopped refreshing while its children kept writing (a SIGSTOPped supervisor): this is
  defence in depth.
"""

from __future__ import annotations

import logging
import time

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

log = logging.getLogger(__name__)

LEASE_TTL_SECONDS = 10
REGISTER_ATTEMPTS = 5
WAIT_MARGIN_S = 2.0
POLL_INTERVAL_S = 0.5


class BrokerIdTaken(Exception):
    """Another broker (another run) is registered under this broker's node id."""


def ensure_cluster_id(store: MetadataStore, keys: Keys) -> str:
    """The cluster's id, creating it if this is the cluster's first broker."""
    candidate = records.new_cluster_id()
    store.transaction([Compare.absent(keys.cluster_id)], [Put(keys.cluster_id, candidate.encode())])
    existing = store.get(keys.cluster_id)
    if existing is None:  # pragma: no cover - deleted between the two calls
        raise MetadataStoreError("cluster id vanished right after it was written")
    return existing.value.decode()


class BrokerRegistration:
    """Keeps ``/brokers/{id}`` present, and ours, for as long as this broker runs."""

    def __init__(
        self, store: MetadataStore, keys: Keys, broker: BrokerRecord, ttl: int = LEASE_TTL_SECONDS
    ) -> None:
        if not broker.run_id:
            raise ValueError("a BrokerRecord to register needs the run_id of this broker")
        self.store = store
        self.broker = broker
        self.key = keys.broker(broker.node_id)
        self.value = records.encode(broker)
        self.ttl = ttl
        self.lease: Lease | None = None
        self._refreshed_at = 0.0
        self._waiting_logged = False

    def register(self, wait: bool = False) -> None:
        """Create the registration on a new lease. Raises ``BrokerIdTaken`` if another run
        holds this node id (with ``wait``, still holds it after the lease TTL), and
        ``MetadataStoreError`` if the store fails."""
        lease = self.store.grant_lease(self.ttl)
        try:
            deadline = time.monotonic() + self.ttl + WAIT_MARGIN_S if wait else 0.0
            while not self._claim(lease, waiting=time.monotonic() < deadline):
                lease.refresh()  # the wait outlasts a third of our own lease's TTL
                time.sleep(POLL_INTERVAL_S)
        except BaseException:
            try:
                lease.revoke()
            except MetadataStoreError as exc:  # it runs out by itself
                log.warning("cannot revoke an unused lease", extra={"error": str(exc)})
            raise
        self.lease = lease
        self._refreshed_at = time.monotonic()

    def _claim(self, lease: Lease, waiting: bool) -> bool:
        """Register on ``lease``: True if done, False if another run holds the id and we are
        ``waiting`` for its lease to run out (else ``BrokerIdTaken``)."""
        for _ in range(REGISTER_ATTEMPTS):
            existing = put_if_absent(self.store, self.key, self.value, lease.id)
            if existing is None:
                return True
            holder = _decode(existing.value)
            if holder is None or holder.run_id != self.broker.run_id:
                taken = (
                    f"broker id {self.broker.node_id} is registered at {self.key} by "
                    f"{_describe(holder, existing.value)}"
                )
                if not waiting:
                    raise BrokerIdTaken(
                        f"{taken}; two brokers cannot share a node id (KAFSCALE_BROKER_ID) on "
                        "one namespace"
                    )
                if not self._waiting_logged:
                    log.warning(
                        "%s; waiting up to %d s for its lease to run out (a crashed broker's "
                        "does, a running broker's never)",
                        taken,
                        self.ttl + WAIT_MARGIN_S,
                    )
                    self._waiting_logged = True
                return False
            # Our own run's registration, left by a coordinator that died: take it over.
            if self.store.transaction(
                [Compare(self.key, mod_revision=existing.mod_revision)],
                [Put(self.key, self.value, lease.id)],
            ).succeeded:
                log.info("replaced the registration of this broker's previous coordinator")
                return True
        raise MetadataStoreError(f"{self.key} kept changing while this broker registered")

    def keep_alive(self) -> None:
        """Refresh the lease when a third of its TTL has passed; re-register if it was lost.

        Raises ``BrokerIdTaken`` if, while the lease was lost, another run took the node id."""
        if time.monotonic() - self._refreshed_at < self.ttl / 3:
            return
        try:
            if self.lease is None:
                self.register()
                log.info("broker registered again")
                return
            self.lease.refresh()
            self._refreshed_at = time.monotonic()
        except LeaseExpired:
            log.warning("broker lease expired; registering again")
            self.lease = None
            self._refreshed_at = 0.0
        except MetadataStoreError as exc:
            log.error("cannot refresh the broker lease", extra={"error": str(exc)})
            self._refreshed_at = time.monotonic() - self.ttl / 3 + 1.0  # retry in a second

    def deregister(self) -> None:
        if self.lease is not None:
            try:
                self.lease.revoke()
            except MetadataStoreError as exc:
                log.warning("cannot revoke the broker lease", extra={"error": str(exc)})
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
