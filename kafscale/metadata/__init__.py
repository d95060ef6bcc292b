"""The metadata store: its interface (``store``) and the backend chosen by configuration.

``open_metadata_store`` picks etcd when ``KAFSCALE_ETCD_ENDPOINTS`` is set and the embedded
SQLite file ``{KAFSCALE_DATA_DIR}/metadata.sqlite`` otherwise. It never falls back from one to the
other: an unreachable etcd raises ``MetadataStoreUnavailable``.
"""

from __future__ import annotations

import os

from kafscale.config import Config
from kafscale.metadata.store import (
    Compare,
    Delete,
    EventType,
    KeyValue,
    Lease,
    LeaseExpired,
    MetadataStore,
    MetadataStoreError,
    MetadataStoreUnavailable,
    Operation,
    Put,
    RevisionCompacted,
    TxnResult,
    Watch,
    WatchEvent,
)

__all__ = [
    "Compare",
    "Delete",
    "EventType",
    "KeyValue",
    "Lease",
    "LeaseExpired",
    "MetadataStore",
    "MetadataStoreError",
    "MetadataStoreUnavailable",
    "Operation",
    "Put",
    "RevisionCompacted",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "open_metadata_store",
]


def open_metadata_store(config: Config) -> MetadataStore:
    """The configured metadata store, checked to answer (else ``MetadataStoreUnavailable``)."""
    if config.etcd_endpoints:
        from kafscale.metadata.etcd import EtcdMetadataStore  # grpc is heavy; import on demand

        return EtcdMetadataStore.from_config(config)
    from kafscale.metadata.sqlite import SqliteMetadataStore

    try:
        os.makedirs(config.data_dir, exist_ok=True)
    except OSError as exc:
        raise MetadataStoreUnavailable(
            f"cannot create the data directory {config.data_dir}: {exc}"
        ) from exc
    return SqliteMetadataStore(os.path.join(config.data_dir, "metadata.sqlite"))
