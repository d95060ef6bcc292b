"""The cluster id is created once: every broker of a namespace agrees on it."""

from __future__ import annotations

from pathlib import Path

from kafscale.coordinator.registry import ensure_cluster_id
from kafscale.metadata.records import Keys
from kafscale.metadata.sqlite import SqliteMetadataStore


def test_the_first_broker_creates_the_cluster_id_and_the_others_read_it(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    first, second = SqliteMetadataStore(path), SqliteMetadataStore(path)
    try:
        created = ensure_cluster_id(first, Keys("ns"))
        assert len(created) == 22
        assert ensure_cluster_id(second, Keys("ns")) == created
        assert ensure_cluster_id(first, Keys("other")) != created
    finally:
        first.close()
        second.close()
