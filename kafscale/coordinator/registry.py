"""The cluster id: created once with a put-if-absent transaction, so brokers racing to start a new
cluster agree on one. (This broker's registration is the supervisor's:
``kafscale.supervisor.membership``.)"""

from __future__ import annotations

from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import Compare, MetadataStore, MetadataStoreError, Put


def ensure_cluster_id(store: MetadataStore, keys: Keys) -> str:
    """The cluster's id, creating it if this is the cluster's first broker."""
    candidate = records.new_cluster_id()
    store.transaction([Compare.absent(keys.cluster_id)], [Put(keys.cluster_id, candidate.encode())])
    existing = store.get(keys.cluster_id)
    if existing is None:  # pragma: no cover - deleted between the two calls
        raise MetadataStoreError("cluster id vanished right after it was written")
    return existing.value.decode()
