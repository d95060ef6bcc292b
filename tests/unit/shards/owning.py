"""Make this broker the owner of partitions, as the coordinator's claims would (leader keys on
the broker lease), for tests that run a real ``Shard`` without a coordinator."""

from __future__ import annotations

from collections.abc import Iterable

from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord
from kafscale.metadata.store import MetadataStore


def own(
    store: MetadataStore,
    topic: str,
    partitions: Iterable[int],
    lease_id: int,
    broker: int = 0,
    epoch: int = 0,
    namespace: str = "default",
) -> None:
    keys = Keys(namespace)
    for partition in partitions:
        leader = LeaderRecord(owner=broker, epoch=epoch, lease=lease_id, run_id="test")
        store.put(keys.leader(topic, partition), records.encode(leader), lease_id=lease_id)
