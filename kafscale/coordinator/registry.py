"""The coordinator's cluster bookkeeping: the cluster id and this broker's registration.

The cluster id is created once with a put-if-absent transaction, so brokers racing to start a new
cluster agree on one. The broker's record is attached to a lease that the coordinator keeps
alive; when the broker stops (or dies and the lease runs out), its record disappears.
"""

from __future__ import annotations

import logging
import time

from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord, Keys
from kafscale.metadata.store import (
    Compare,
    Lease,
    LeaseExpired,
    MetadataStore,
    MetadataStoreError,
    Put,
)

log = logging.getLogger(__name__)

LEASE_TTL_SECONDS = 10


def ensure_cluster_id(store: MetadataStore, keys: Keys) -> str:
    """The cluster's id, creating it if this is the cluster's first broker."""
    candidate = records.new_cluster_id()
    store.transaction([Compare.absent(keys.cluster_id)], [Put(keys.cluster_id, candidate.encode())])
    existing = store.get(keys.cluster_id)
    if existing is None:  # pragma: no cover - deleted between the two calls
        raise MetadataStoreError("cluster id vanished right after it was written")
    return existing.value.decode()


class BrokerRegistration:
    """Keeps ``/brokers/{id}`` present for as long as this broker runs."""

    def __init__(
        self, store: MetadataStore, keys: Keys, broker: BrokerRecord, ttl: int = LEASE_TTL_SECONDS
    ) -> None:
        self.store = store
        self.key = keys.broker(broker.node_id)
        self.value = records.encode(broker)
        self.ttl = ttl
        self.lease: Lease | None = None
        self._refreshed_at = 0.0

    def register(self) -> None:
        self.lease = self.store.grant_lease(self.ttl)
        self.store.put(self.key, self.value, lease_id=self.lease.id)
        self._refreshed_at = time.monotonic()

    def keep_alive(self) -> None:
        """Refresh the lease when a third of its TTL has passed; re-register if it was lost."""
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
