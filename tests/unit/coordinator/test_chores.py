"""One broker runs the cluster's chores; another takes over when its lease ends."""

from __future__ import annotations

from pathlib import Path

from kafscale.coordinator.chores import CHECK_MS, Chores
from kafscale.metadata.records import Keys
from kafscale.metadata.sqlite import SqliteMetadataStore


def test_one_broker_holds_the_chores_until_its_lease_ends(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    keys = Keys("ns")
    first_lease, second_lease = store.grant_lease(60), store.grant_lease(60)
    first = Chores(store, keys, 1, first_lease.id, "run-1")
    second = Chores(store, keys, 2, second_lease.id, "run-2")
    assert first.held(0) and not second.held(0)
    assert first.held(CHECK_MS) and not second.held(CHECK_MS)
    first_lease.revoke()  # broker 1 stopped or died
    assert second.held(2 * CHECK_MS)
    assert not first.held(2 * CHECK_MS)
    store.close()
