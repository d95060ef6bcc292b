"""A successor re-flushes the buffers it adopted: the flusher and the coordinator's committer (real
ones, in-process, on the embedded stores) must take that as the same segment again -- whether the
predecessor's flush had uploaded without committing, or commits while the successor already holds
the buffer -- and never rewrite an object or commit twice."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from kafscale import config as configuration
from kafscale.coordinator.partitions import PartitionCommitter
from kafscale.flusher.process import Flusher
from kafscale.ipc import messages
from kafscale.ipc.rpc import Reply, RpcTimeout
from kafscale.ipc.shm import sweep_segments
from kafscale.metadata import records as metadata
from kafscale.metadata.records import Keys, TopicRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.shards.loading import PartitionLoader
from kafscale.shards.partition import PartitionLog
from kafscale.shards.process import flush_request
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.supervisor.child import ChildContext

T0 = 1_700_000_000_000
TOPIC, TOPIC_ID, CREATED = "events", str(uuid.UUID(int=77)), T0 - 1000
SNAPPY = 2


class Coordinator:
    """The flusher's coordinator client, answered by a real committer (or lost on demand)."""

    def __init__(self, committer: PartitionCommitter) -> None:
        self.committer = committer
        self.down = False
        self.commits = 0

    def call(self, message: messages.Message, timeout_ms: int = 0) -> Reply:
        if self.down:
            raise RpcTimeout("the coordinator did not answer")
        assert isinstance(message, messages.CommitSegment)
        self.commits += 1
        return Reply(self.committer.commit(message))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"}
        config = configuration.load(env)
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.objects = LocalObjectStore(str(tmp_path / "objects"))
        self.keys = Keys(config.s3_namespace)
        topic = TopicRecord(name=TOPIC, topic_id=TOPIC_ID, partitions=1, created_ms=CREATED)
        self.store.put(self.keys.topic(TOPIC), metadata.encode(topic))
        self.ctx = ChildContext(
            config=config,
            role="flusher",
            index=0,
            runtime_dir=str(tmp_path),
            run_id=uuid.uuid4().hex[:12],
            zmq_context=zmq.Context(),
        )
        self.flusher = Flusher(self.ctx, self.objects, self.store)
        self.coordinator = Coordinator(PartitionCommitter(self.store, config.s3_namespace))
        self.flusher._coordinator = lambda: self.coordinator  # type: ignore[assignment,method-assign,return-value]
        self.kfs = segments.segment_key(config.s3_namespace, TOPIC, 0, 0)
        self.logs: list[PartitionLog] = []

    def loader(self) -> PartitionLoader:
        coordinator: Any = None
        return PartitionLoader(
            self.ctx.config, self.store, self.objects, coordinator, self.ctx.run_id, 0
        )

    def predecessor(self) -> tuple[PartitionLog, messages.FlushSegment]:
        """A shard that wrote and sealed one buffer, then died with it: its flush request."""
        log = self.loader().load(TOPIC, TOPIC_ID, 0, CREATED)
        log.codec = SNAPPY
        for i in range(20):
            batch = records.build_batch(
                [(None, b"value-%d" % i * 20, (), T0 + i)],
                producer_id=7,
                producer_epoch=0,
                base_sequence=i,
            )
            log.append(memoryview(batch), records.read_header(batch), T0 + i, False)
        log.seal(T0 + 100)
        [segment] = log.sealed
        return log, flush_request(log, segment, CREATED)

    def successor(self) -> messages.FlushSegment:
        [(log, created)] = self.loader().adopt_predecessor(now_ms=T0 + 5_000)
        self.logs.append(log)
        segment = log.next_flush()
        assert segment is not None
        return flush_request(log, segment, created)

    def high_watermark(self) -> int:
        kv = self.store.get(self.keys.partition(TOPIC, 0))
        return metadata.decode_partition(kv.value).high_watermark if kv else 0

    def close(self) -> None:
        for log in self.logs:
            log.close()
        self.flusher.close()
        self.store.close()
        self.ctx.zmq_context.term()
        assert sweep_segments(self.ctx.run_id) == []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()


def die(log: PartitionLog) -> None:
    for segment in log.sealed:
        segment.buffer.close()


def test_the_successor_asks_for_the_very_same_segment(rig: Rig) -> None:
    log, before = rig.predecessor()
    die(log)
    assert rig.successor() == before  # buffer, sizes, offsets, created time, codec, producers


def test_an_upload_whose_commit_was_lost_is_committed_by_the_re_flush(rig: Rig) -> None:
    log, before = rig.predecessor()
    rig.coordinator.down = True  # uploaded, then the commit never happened
    lost = rig.flusher.flush(before)
    assert not lost.committed and lost.storage_error
    uploaded = rig.objects.get(rig.kfs)
    die(log)

    rig.coordinator.down = False
    after = rig.flusher.flush(rig.successor())
    assert after.committed and after.high_watermark == 20
    assert rig.high_watermark() == 20
    assert rig.objects.get(rig.kfs) == uploaded  # the same bytes, not rewritten


def test_a_commit_landing_after_the_successor_took_over_is_answered_committed(rig: Rig) -> None:
    log, before = rig.predecessor()
    die(log)
    again = rig.successor()  # read the high watermark (0) and adopted the buffer
    first = rig.flusher.flush(before)  # then the predecessor's flush, still in flight, lands
    assert first.committed and rig.high_watermark() == 20
    uploaded = rig.objects.get(rig.kfs)
    commits = rig.coordinator.commits

    second = rig.flusher.flush(again)
    assert second.committed and second.high_watermark == 20
    assert rig.coordinator.commits == commits + 1  # asked, and refused as committed already
    assert rig.high_watermark() == 20
    assert rig.objects.get(rig.kfs) == uploaded
    assert len(rig.store.get_prefix(rig.keys.segments(TOPIC, 0))) == 1
