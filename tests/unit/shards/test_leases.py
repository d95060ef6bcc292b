"""Which partitions a shard serves: its view of the leader keys; the store when the view lags."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.shards.leases import NotLeader, ShardLeases

KEYS = Keys("ns")


def test_ours_others_and_a_lagging_view(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    lease = store.grant_lease(60)
    leases = ShardLeases(store, "ns", me=1, lease=lease.id)  # not started: its view stays empty
    with pytest.raises(NotLeader):
        leases.require("t", 0)
    mine = LeaderRecord(owner=1, epoch=3, lease=lease.id, run_id="r")
    store.put(KEYS.leader("t", 0), records.encode(mine), lease_id=lease.id)
    other = LeaderRecord(owner=2, epoch=4, lease=lease.id + 1, run_id="r2")
    store.put(KEYS.leader("t", 1), records.encode(other))
    assert leases.require("t", 0) == 3  # found in the store: the view has not caught up
    with pytest.raises(NotLeader):
        leases.require("t", 1)
    # Until the view reaches the key's revision, its silence does not mean the key is gone.
    assert leases.lost({("t", 0): 3}) == []
    leases.sealing[("t", 0)] = 3
    with pytest.raises(NotLeader, match="handed over"):
        leases.require_writable("t", 0)
    store.close()


def test_the_view_decides_once_it_caught_up(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    lease = store.grant_lease(60)
    mine = LeaderRecord(owner=1, epoch=3, lease=lease.id, run_id="r")
    store.put(KEYS.leader("t", 0), records.encode(mine), lease_id=lease.id)
    leases = ShardLeases(store, "ns", me=1, lease=lease.id)
    leases.start()
    try:
        assert leases.epoch("t", 0) == 3 and leases.lost({("t", 0): 3}) == []
        assert leases.lost({("t", 0): 2}) == [("t", 0)]  # loaded at an older epoch
        lease.revoke()  # our lease ended: the key went with it
        assert leases.view.wait_until(lambda s: ("t", 0) not in s.leaders, 10)
        assert leases.lost({("t", 0): 3}) == [("t", 0)]
    finally:
        leases.stop()
        store.close()
