"""A shard's successor takes over its buffers (``PartitionLoader.adopt_predecessor``): real
shared-memory buffers written by a predecessor ``PartitionLog``, the embedded metadata store, no
processes. The predecessor "dies" by unmapping its buffers without destroying them, which is what
a SIGKILL leaves in /dev/shm."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.ipc.shm import (
    SHM_DIR,
    BufferOwner,
    PartitionBuffer,
    run_prefix,
    segment_name,
    shard_segments,
    sweep_segments,
)
from kafscale.metadata import records as metadata
from kafscale.metadata.records import Keys, PartitionRecord, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.shards.loading import PartitionLoader
from kafscale.shards.partition import PartitionLog
from kafscale.shards.producers import Verdict
from kafscale.storage.local import LocalObjectStore

T0 = 1_700_000_000_000
TOPIC, TOPIC_ID = "events", str(uuid.UUID(int=21))
CREATED = T0 - 60_000
PRODUCER, EPOCH = 4242, 3


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {
            "KAFSCALE_DATA_DIR": str(tmp_path),
            "KAFSCALE_SHARDS": "2",
            "KAFSCALE_SEGMENT_BYTES": "1024",
        }
        self.config = configuration.load(env)
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.objects = LocalObjectStore(str(tmp_path / "objects"))
        self.keys = Keys(self.config.s3_namespace)
        self.run_id = uuid.uuid4().hex[:12]
        self.put_topic(TOPIC, TOPIC_ID)
        self.logs: list[PartitionLog] = []

    def put_topic(self, name: str, topic_id: str) -> None:
        topic = TopicRecord(name=name, topic_id=topic_id, partitions=2, created_ms=CREATED)
        self.store.put(self.keys.topic(name), metadata.encode(topic))

    def loader(self, shard: int = 0) -> PartitionLoader:
        coordinator: Any = None  # only the lazy load of uncommitted uploads calls it
        return PartitionLoader(
            self.config, self.store, self.objects, coordinator, self.run_id, shard
        )

    def close(self) -> None:
        for log in self.logs:
            log.close()
        self.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()
    assert sweep_segments(rig.run_id) == [], "buffers were left in /dev/shm"


def produce(log: PartitionLog, count: int, now: int, first_seq: int = 0) -> list[int]:
    """``count`` batches of one idempotent producer; the base offsets they got."""
    offsets = []
    for i in range(count):
        value = f"record-{first_seq + i:04d}-".encode() * 6
        batch = records.build_batch(
            [(None, value, (), now + i)],
            producer_id=PRODUCER,
            producer_epoch=EPOCH,
            base_sequence=first_seq + i,
        )
        outcome = log.append(memoryview(batch), records.read_header(batch), now, False)
        assert outcome.error == 0 and not outcome.duplicate
        offsets.append(outcome.base_offset)
    return offsets


def die(log: PartitionLog) -> None:
    """What SIGKILL does to the owner: its mappings go, its segments stay."""
    for segment in [*log.sealed, *([log.open] if log.open else [])]:
        segment.buffer.close()


def stored_bytes(log: PartitionLog) -> bytes:
    return b"".join(
        segment.whole().data for segment in [*log.sealed, *([log.open] if log.open else [])]
    )


def slot(name: str) -> int:
    return int(name.rsplit("-b", 1)[1])


def on_disk(run_id: str) -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(run_prefix(run_id))}


def test_the_successor_keeps_acknowledged_data_and_continues_its_offsets(rig: Rig) -> None:
    before = rig.loader()
    log = before.load(TOPIC, TOPIC_ID, 0, CREATED)
    log.codec = 2  # snappy: a re-flush must compress the same way
    offsets = produce(log, 40, T0)
    assert offsets == list(range(40))
    assert len(log.sealed) >= 3 and log.open is not None  # sealed ones and an open one
    flushed, kept = log.sealed[0], list(log.sealed)[1:]
    data, next_offset = stored_bytes(log), log.next_offset
    flushed_size = flushed.size
    seals = [(s.buffer.name, s.sealed_ms) for s in kept]
    # The first buffer's flush was committed just before the shard died: the high watermark
    # and producer state moved, the destroy never happened.
    committed = PartitionRecord(
        topic_id=TOPIC_ID, high_watermark=flushed.next_offset, producers=flushed.producers
    )
    rig.store.put(rig.keys.partition(TOPIC, 0), metadata.encode(committed))
    flushed_name, open_name = flushed.buffer.name, log.open.buffer.name
    die(log)

    after = rig.loader()
    [adopted] = after.adopt_predecessor(now_ms=T0 + 9_000)
    rig.logs.append(adopted)
    assert adopted.topic_created_ms == CREATED
    assert (adopted.topic, adopted.topic_id, adopted.partition) == (TOPIC, TOPIC_ID, 0)
    assert (adopted.high_watermark, adopted.next_offset) == (committed.high_watermark, 40)
    assert flushed_name not in on_disk(rig.run_id)  # flushed already: destroyed
    assert adopted.open is None  # everything is sealed, offered at the first cut
    assert [(s.buffer.name, s.sealed_ms) for s in list(adopted.sealed)[:-1]] == seals
    last = adopted.sealed[-1]
    assert (last.buffer.name, last.sealed_ms) == (open_name, T0 + 9_000)
    for segment in adopted.sealed:
        state = segment.buffer.snapshot()
        assert state.sealed and state.codec == 2 and state.sealed_ms == segment.sealed_ms
        assert segment.codec == 2
    assert stored_bytes(adopted) == data[flushed_size:]
    assert adopted.buffered(next_offset - 1) is adopted.sealed[-1]  # fetches from buffers
    chunk = adopted.sealed[0].chunk(committed.high_watermark + 1, 1)
    assert chunk.first_offset == committed.high_watermark + 1

    # The producer retries its last batch (its acknowledgement died with the shard).
    retry = adopted.producers.check(PRODUCER, EPOCH, 39, 0)
    assert retry.verdict is Verdict.DUPLICATE and retry.duplicate_of is not None
    assert retry.duplicate_of.first_offset == 39
    # New appends get new offsets, in a buffer whose name was never used in this run.
    used = [slot(name) for name in [flushed_name, open_name, *on_disk(rig.run_id)]]
    assert after.last_slot == max(used)
    assert produce(adopted, 1, T0 + 10_000, first_seq=40) == [40]
    assert adopted.open is not None
    assert slot(adopted.open.buffer.name) == max(used) + 1


def test_a_second_crash_adopts_the_same_buffers_again(rig: Rig) -> None:
    log = rig.loader().load(TOPIC, TOPIC_ID, 1, CREATED)
    produce(log, 5, T0)
    die(log)
    [first] = rig.loader().adopt_predecessor(now_ms=T0 + 1)
    names = [s.buffer.name for s in first.sealed]
    die(first)  # the successor dies too, before any commit
    [second] = rig.loader().adopt_predecessor(now_ms=T0 + 2)
    rig.logs.append(second)
    assert [s.buffer.name for s in second.sealed] == names
    assert [s.sealed_ms for s in second.sealed] == [T0 + 1]  # the first successor's seal
    assert second.next_offset == 5


def test_a_torn_tail_is_truncated_in_shared_memory(rig: Rig) -> None:
    log = rig.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
    produce(log, 3, T0)
    assert log.open is not None and not log.sealed
    name, good = log.open.buffer.name, log.open.starts[-1]
    die(log)
    with PartitionBuffer.attach(name, writable=True) as raw:
        raw._data[good + 70] ^= 0xFF  # a flipped byte in the last batch's records
    [adopted] = rig.loader().adopt_predecessor(now_ms=T0)
    rig.logs.append(adopted)
    assert adopted.next_offset == 2  # offset 2 was never acknowledged intact: given out again
    [segment] = adopted.sealed
    assert segment.size == good
    assert segment.buffer.snapshot().committed == good


def test_a_failed_metadata_read_leaves_every_buffer_for_the_next_try(rig: Rig) -> None:
    log = rig.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
    produce(log, 3, T0)
    die(log)
    names = on_disk(rig.run_id)
    loader = rig.loader()
    real_get = rig.store.get

    def unreachable(key: str) -> Any:
        raise ConnectionError("etcd is down")

    rig.store.get = unreachable  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        loader.adopt_predecessor(now_ms=T0)
    assert on_disk(rig.run_id) == names
    rig.store.get = real_get  # type: ignore[method-assign]
    [adopted] = loader.adopt_predecessor(now_ms=T0)
    rig.logs.append(adopted)
    assert adopted.next_offset == 3


def test_other_topics_garbage_and_other_shards(rig: Rig) -> None:
    deleted = BufferOwner("gone", str(uuid.UUID(int=99)), 0, CREATED)
    orphan = PartitionBuffer.create(segment_name(rig.run_id, 0, 7), 4096, owner=deleted)
    orphan.append(records.build_batch([(None, b"x", (), T0)]), records=1)
    orphan.close()
    recreated = BufferOwner(TOPIC, str(uuid.UUID(int=98)), 0, CREATED - 1)  # an older incarnation
    stale = PartitionBuffer.create(segment_name(rig.run_id, 0, 8), 4096, owner=recreated)
    stale.append(records.build_batch([(None, b"y", (), T0)]), records=1)
    stale.close()
    anonymous = PartitionBuffer.create(segment_name(rig.run_id, 0, 9), 64)  # no owner
    anonymous.close()
    with open(os.path.join(SHM_DIR, segment_name(rig.run_id, 0, 12)), "wb") as file:
        file.write(b"not a buffer at all")
    neighbour = rig.loader(shard=1).load(TOPIC, TOPIC_ID, 1, CREATED)
    produce(neighbour, 2, T0)
    rig.logs.append(neighbour)

    loader = rig.loader()
    assert loader.adopt_predecessor(now_ms=T0) == []
    assert [name for name, _ in shard_segments(rig.run_id, 0)] == []
    assert loader.last_slot == 12  # unreadable ones count too: their names are never reused
    assert len(shard_segments(rig.run_id, 1)) == 1  # shard 1's buffer is not ours to judge


def test_a_name_the_predecessor_destroyed_may_return_but_not_its_generation(rig: Rig) -> None:
    log = rig.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
    produce(log, 2, T0)
    log.seal(T0)
    [segment] = log.sealed
    # What the predecessor handed to a cycle; its commit was answered, so the buffer went (an
    # older cycle holding the same entry may still be in flight at the flusher).
    name, generation, size = segment.buffer.name, segment.buffer.generation, segment.size
    log.committed(high_watermark=2)
    rig.store.put(
        rig.keys.partition(TOPIC, 0),
        metadata.encode(PartitionRecord(topic_id=TOPIC_ID, high_watermark=2)),
    )
    loader = rig.loader()  # the successor finds nothing to adopt
    assert loader.adopt_predecessor(now_ms=T0 + 1) == []
    successor = loader.load(TOPIC, TOPIC_ID, 0, CREATED)
    rig.logs.append(successor)
    produce(successor, 4, T0 + 2, first_seq=2)
    assert successor.open is not None and successor.open.buffer.name == name  # the name is back
    with PartitionBuffer.attach(name) as reader:  # as the flusher reads a WalEntry
        assert reader.snapshot().committed >= size
        assert reader.read(0, size, generation) is None  # not the old buffer: refused
