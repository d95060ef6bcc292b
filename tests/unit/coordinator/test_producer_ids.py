from pathlib import Path

from kafscale.coordinator.producer_ids import ProducerIdAllocator
from kafscale.metadata.sqlite import SqliteMetadataStore


def test_ids_are_unique_across_allocators_and_restarts(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    try:
        first = ProducerIdAllocator(store, "ns", block_size=3)
        second = ProducerIdAllocator(store, "ns", block_size=3)  # another broker
        handed = [
            first.allocate(),
            second.allocate(),
            first.allocate(),
            first.allocate(),
            first.allocate(),
            second.allocate(),
        ]
        assert handed == [0, 3, 1, 2, 6, 4]
        restarted = ProducerIdAllocator(store, "ns", block_size=3)
        assert restarted.allocate() == 9  # the rest of earlier blocks is never reused
        assert ProducerIdAllocator(store, "other", block_size=3).allocate() == 0
    finally:
        store.close()
