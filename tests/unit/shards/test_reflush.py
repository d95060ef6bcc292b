"""A successor offers the buffers it adopted at its first cut as the very entries its predecessor
handed to a cycle (same buffer, generation, offsets, created time, codec, producers), so a flusher
that already uploaded or committed them builds the same chunk, and the commit planner answers the
re-offer "committed". Real shared-memory buffers and the embedded metadata store, no processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.ipc import write_path
from kafscale.ipc.shm import sweep_segments
from kafscale.metadata import records as metadata
from kafscale.metadata.records import Keys, PartitionRecord, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.shards.flushes import Holds
from kafscale.shards.loading import PartitionLoader
from kafscale.shards.partition import PartitionLog
from kafscale.storage.local import LocalObjectStore

T0 = 1_700_000_000_000
TOPIC, TOPIC_ID, CREATED = "events", str(uuid.UUID(int=77)), T0 - 1000
SNAPPY = 2
KEY = (TOPIC, 0)


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"}
        self.config = configuration.load(env)
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.objects = LocalObjectStore(str(tmp_path / "objects"))
        self.keys = Keys(self.config.s3_namespace)
        topic = TopicRecord(name=TOPIC, topic_id=TOPIC_ID, partitions=1, created_ms=CREATED)
        self.store.put(self.keys.topic(TOPIC), metadata.encode(topic))
        self.run_id = uuid.uuid4().hex[:12]
        self.logs: list[PartitionLog] = []

    def loader(self) -> PartitionLoader:
        coordinator: Any = None  # only the lazy load of uncommitted uploads calls it
        return PartitionLoader(self.config, self.store, self.objects, coordinator, self.run_id, 0)

    def predecessor(self, batches: int = 20) -> tuple[PartitionLog, list[write_path.WalEntry]]:
        """A shard that wrote and sealed its buffers and handed them to a cycle (the entries)."""
        log = self.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
        log.codec = SNAPPY
        for i in range(batches):
            batch = records.build_batch(
                [(None, b"value-%d" % i * 20, (), T0 + i)],
                producer_id=7,
                producer_epoch=0,
                base_sequence=i,
            )
            log.append(memoryview(batch), records.read_header(batch), T0 + i, False)
        log.seal(T0 + 100)
        taken = Holds().cut(1, T0 + 100, [(KEY, log.sealed)])
        return log, [log.wal_entry(buffer) for _, buffer in taken]

    def successor(self) -> tuple[PartitionLog, list[write_path.WalEntry]]:
        """The successor's partition after adoption, and what its first cut hands over."""
        [log] = self.loader().adopt_predecessor(now_ms=T0 + 5_000)
        self.logs.append(log)
        taken = Holds().cut(1, T0 + 5_000, [(KEY, log.sealed)])
        return log, [log.wal_entry(buffer) for _, buffer in taken]

    def close(self) -> None:
        for log in self.logs:
            log.close()
        self.store.close()
        assert sweep_segments(self.run_id) == []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()


def die(log: PartitionLog) -> None:
    for segment in [*log.sealed, *([log.open] if log.open else [])]:
        segment.buffer.close()


def test_the_successor_offers_the_very_same_entries(rig: Rig) -> None:
    log, before = rig.predecessor()
    assert [e.topic_created_ms for e in before] == [CREATED]
    die(log)
    _, after = rig.successor()
    assert after == before  # buffer, generation, sizes, offsets, created time, codec, producers


def test_an_open_buffer_is_sealed_by_the_successor_and_offered(rig: Rig) -> None:
    log = rig.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
    batch = records.build_batch([(None, b"x", (), T0)])
    log.append(memoryview(batch), records.read_header(batch), T0, False)
    die(log)  # died before any cut
    adopted, [entry] = rig.successor()
    assert (entry.base_offset, entry.last_offset, entry.created_ms) == (0, 0, T0 + 5_000)
    assert adopted.next_offset == 1


def test_a_re_offered_entry_answered_committed_frees_the_buffer(rig: Rig) -> None:
    log, [entry] = rig.predecessor()
    die(log)
    adopted, _ = rig.successor()
    # The predecessor's cycle committed after the successor read the high watermark (0).
    committed = PartitionRecord(topic_id=TOPIC_ID, high_watermark=entry.last_offset + 1)
    rig.store.put(rig.keys.partition(TOPIC, 0), metadata.encode(committed))
    freed = adopted.committed(entry.last_offset + 1)
    assert [b.base_offset for b in freed] == [entry.base_offset]
    assert adopted.high_watermark == adopted.next_offset == 20 and not adopted.sealed
