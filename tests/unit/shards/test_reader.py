"""The shard's read path (``ReadPath``) without processes: real partition buffers in shared
memory, a real local object store, a clock the test moves, and replies collected from a stand-in
for the shard's ROUTER socket."""

from __future__ import annotations

import select
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kafscale import config as configuration
from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.ipc.shm import PartitionBuffer, segment_name
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards import gate
from kafscale.shards.partition import PartitionLog
from kafscale.shards.producers import ProducerStates
from kafscale.shards.reader import ReadPath
from kafscale.shards.segments import CommittedSegments
from kafscale.storage import segment as segments
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectInfo, ObjectStoreUnavailable

TOPIC, TOPIC_ID = "events", str(uuid.UUID(int=7))
T0 = 1_700_000_000_000


@dataclass
class Replies:
    """Stands in for the shard's RpcServer: what ``reply`` was given."""

    sent: list[tuple[messages.Message, list[bytes]]] = field(default_factory=list)

    def reply(self, incoming: Incoming, message: messages.Message, bulk: Any = ()) -> None:
        self.sent.append((message, [bytes(b) for b in bulk]))


class Clock:
    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        return self.ms


class FlakyStore:
    """A real local store that can be switched off, counting what reaches it."""

    def __init__(self, root: str) -> None:
        self.inner = LocalObjectStore(root)
        self.down = False
        self.gets = 0
        self.bytes = 0
        self.keys: list[str] = []  # of every get

    description = "flaky"

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.gets += 1
        self.keys.append(key)
        if self.down:
            raise ObjectStoreUnavailable("the test switched the store off")
        data = self.inner.get(key, start, length)
        self.bytes += len(data)
        return data

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def list(self, prefix: str) -> list[ObjectInfo]:
        raise AssertionError("the read path never lists")

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


class Rig:
    """One partition, its flushes (done as the flusher does them) and a ReadPath over it."""

    def __init__(self, tmp_path: Any, **settings: str) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1", **settings}
        self.config = configuration.load(env)
        self.store = FlakyStore(str(tmp_path / "objects"))
        self.clock = Clock()
        self.replies = Replies()
        self.slots = 0
        self.run_id = uuid.uuid4().hex[:10]
        self.partition = self.new_partition()
        self.reader = self.new_reader()

    def new_partition(
        self, committed: CommittedSegments | None = None, hw: int = 0
    ) -> PartitionLog:
        return PartitionLog(
            TOPIC,
            TOPIC_ID,
            0,
            hw,
            ProducerStates(),
            self.config.segment_bytes,
            self._buffer,
            segments=committed,
        )

    def new_reader(self) -> ReadPath:
        return ReadPath(
            self.config,
            self.store,
            self.replies,  # type: ignore[arg-type]
            lambda *_: self.partition,
            "0",
            self.clock,
        )

    def _buffer(self, capacity: int, base_offset: int, codec: int) -> PartitionBuffer:
        self.slots += 1
        return PartitionBuffer.create(
            segment_name(self.run_id, 0, self.slots), capacity, base_offset, codec=codec
        )

    def append(self, *values: bytes, timestamp: int = T0) -> None:
        batch = records.build_batch([(None, v, (), timestamp + i) for i, v in enumerate(values)])
        outcome = self.partition.append(
            memoryview(batch), records.read_header(batch), self.clock(), False
        )
        assert outcome.error == ErrorCode.none
        self.reader.appended(self.partition)

    def flush(self) -> SegmentRecord:
        self.partition.seal(self.clock())
        buffered = self.partition.sealed[0]
        data = buffered.buffer.read(0, buffered.size)
        assert data is not None
        spans, position = [], 0
        while position < len(data):
            size = records.read_header(data, position).size
            spans.append(data[position : position + size])
            position += size
        kfs, index = segments.build_segment(spans, 0, buffered.sealed_ms, index_interval=2)
        base = buffered.base_offset
        for key, blob in (
            (segments.segment_key(self.config.s3_namespace, TOPIC, 0, base), kfs),
            (segments.index_key(self.config.s3_namespace, TOPIC, 0, base), index),
        ):
            self.store.put_if_absent(key, blob)
        record = SegmentRecord(
            base, buffered.last_offset, len(kfs), len(index), buffered.records,
            buffered.max_timestamp, buffered.sealed_ms,
        )  # fmt: skip
        chunk = buffered.whole()
        self.partition.committed(buffered.last_offset + 1)
        self.reader.flushed(self.partition, chunk, record)
        return record

    def fetch(
        self, offset: int, *, max_bytes: int = 1 << 20, min_bytes: int = 1, wait_ms: int = 0,
        fetch_id: int = 1, total_bytes: int = 1 << 20,
    ) -> None:  # fmt: skip
        entry = messages.FetchEntry(TOPIC, TOPIC_ID, 0, offset, max_bytes)
        request = messages.Fetch(fetch_id, [entry], total_bytes, min_bytes, wait_ms)
        self.reader.on_fetch(Incoming(b"frontend", b"r", request), request)

    def answers(self) -> list[tuple[messages.FetchResult, list[batches_type]]]:
        out = []
        for message, bulk in self.replies.sent:
            assert isinstance(message, messages.Fetched)
            frames = iter(bulk)
            for result in message.results:
                data = next(frames) if result.size else b""
                out.append((result, values_of(data)))
        self.replies.sent.clear()
        return out

    def list_offsets(self, *timestamps: int) -> list[messages.OffsetAnswer]:
        queries = [messages.OffsetQuery(TOPIC, TOPIC_ID, 0, ts) for ts in timestamps]
        request = messages.ListOffsets(queries)
        self.reader.on_list_offsets(Incoming(b"frontend", b"r", request), request)
        self.wait_for(lambda: bool(self.replies.sent))
        message, _ = self.replies.sent.pop()
        assert isinstance(message, messages.OffsetsListed)
        return message.results

    def wait_for(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, "object-store reads never completed"
            select.select([self.reader.wakeup_fd], [], [], 0.05)
            self.reader.on_completions()

    def close(self) -> None:
        self.reader.close()
        self.partition.close()


batches_type = tuple[int, bytes]


def values_of(data: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    position = 0
    while position < len(data):
        size = records.read_header(data, position).size
        out.extend(
            (r.offset, r.value or b"")
            for r in records.iter_records(data[position : position + size])
        )
        position += size
    return out


@pytest.fixture
def rig(tmp_path: Any) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    made.close()


def test_a_waiting_fetch_is_answered_when_the_records_are_committed(rig: Rig) -> None:
    rig.fetch(0, wait_ms=5000)
    assert rig.replies.sent == []  # parked: nothing to read yet
    rig.append(b"a", b"b")
    assert rig.replies.sent == []  # appended, not committed: not visible by default
    rig.flush()
    [(result, got)] = rig.answers()
    assert (result.error_code, result.high_watermark, got) == (0, 2, [(0, b"a"), (1, b"b")])


def test_a_waiting_fetch_is_answered_empty_at_its_deadline_or_when_released(rig: Rig) -> None:
    rig.fetch(0, wait_ms=500)
    rig.clock.ms += 499
    rig.reader.tick(rig.clock())
    assert rig.replies.sent == []
    rig.clock.ms += 1
    rig.reader.tick(rig.clock())
    [(result, got)] = rig.answers()
    assert (result.error_code, result.high_watermark, got) == (0, 0, [])
    rig.fetch(0, wait_ms=60_000, fetch_id=2)
    rig.reader.on_release(Incoming(b"frontend", b"x", None), messages.ReleaseFetch(2))  # type: ignore[arg-type]
    [(result, got)] = rig.answers()
    assert got == []


def test_offsets_outside_the_log_are_out_of_range(rig: Rig) -> None:
    rig.append(b"a")
    rig.flush()
    rig.fetch(2)
    [(result, _)] = rig.answers()
    assert result.error_code == ErrorCode.offset_out_of_range
    rig.fetch(1, wait_ms=100)  # the end of the log: nothing yet, no error
    rig.clock.ms += 100
    rig.reader.tick(rig.clock())
    [(result, got)] = rig.answers()
    assert (result.error_code, got) == (0, [])


def test_fetch_mid_batch_returns_the_whole_batch_and_respects_max_bytes(rig: Rig) -> None:
    rig.append(b"a0", b"a1", b"a2")
    rig.append(b"b" * 500)
    rig.append(b"c")
    rig.flush()
    rig.fetch(1, max_bytes=1)  # inside the first batch; one batch even though it is too big
    [(_, got)] = rig.answers()
    assert got == [(0, b"a0"), (1, b"a1"), (2, b"a2")]
    rig.fetch(3, max_bytes=10_000)
    [(_, got)] = rig.answers()
    assert got == [(3, b"b" * 500), (4, b"c")]


def test_unflushed_data_is_served_only_when_configured(tmp_path: Any) -> None:
    rig = Rig(tmp_path, KAFSCALE_FETCH_UNFLUSHED="true")
    try:
        rig.fetch(0, wait_ms=5000)
        rig.append(b"early")
        [(result, got)] = rig.answers()
        assert (result.high_watermark, got) == (1, [(0, b"early")])
    finally:
        rig.close()


def test_cold_reads_use_the_index_and_fill_the_cache(rig: Rig) -> None:
    for i in range(40):
        rig.append(b"%02d" % i + b"x" * 2000)
    record = rig.flush()
    # a broker restarted: the partition comes back with its segment list, caches are empty
    rig.reader.close()
    rig.partition.close()
    rig.partition = rig.new_partition(CommittedSegments([record]), hw=40)
    rig.reader = rig.new_reader()
    rig.fetch(30, max_bytes=1)
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(_, got)] = rig.answers()
    assert got == [(30, b"30" + b"x" * 2000)]
    assert rig.store.gets == 2  # the index, then one ranged read of the segment
    assert rig.store.bytes < record.size / 2
    gets = rig.store.gets
    rig.fetch(30, max_bytes=1)
    [(_, got)] = rig.answers()  # answered at once, from the cache
    assert got[0][0] == 30 and rig.store.gets == gets


def test_object_store_outage_refuses_reads_fast_then_probes_and_recovers(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.append(b"v")
    record = rig.flush()
    rig.reader.close()
    rig.partition.close()
    rig.partition = rig.new_partition(CommittedSegments([record]), hw=1)
    rig.reader = rig.new_reader()
    rig.store.down = True
    rig.fetch(0)
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, _)] = rig.answers()
    assert result.error_code == ErrorCode.kafka_storage_error
    # The client is told to retry; the backend's text and the object key stay in the log.
    assert result.message == "the object store cannot be read; retry later"
    gets = rig.store.gets
    rig.fetch(0)  # refused at once, without going to the store
    [(result, _)] = rig.answers()
    assert result.error_code == ErrorCode.kafka_storage_error and rig.store.gets == gets
    rig.fetch(0, wait_ms=300)  # a storage error waits out max_wait instead of answering at once
    assert rig.replies.sent == []
    rig.clock.ms += 300
    rig.reader.tick(rig.clock())
    [(result, _)] = rig.answers()
    assert result.error_code == ErrorCode.kafka_storage_error
    rig.store.down = False
    rig.clock.ms += gate.READ_BACKOFF_MS
    rig.fetch(0)  # the probe
    rig.wait_for(lambda: bool(rig.replies.sent))
    [(result, got)] = rig.answers()
    assert (result.error_code, got) == (0, [(0, b"v")])


def test_list_offsets_special_values_and_timestamps(rig: Rig) -> None:
    rig.append(b"a", b"b", timestamp=T0)  # timestamps T0, T0+1
    rig.append(b"c", timestamp=T0 + 50)
    first = rig.flush()
    rig.append(b"d", b"e", timestamp=T0 + 10)  # out of order: T0+10, T0+11
    second = rig.flush()
    answers = rig.list_offsets(-1, -2, -4, -5, T0 + 1, T0 + 11, T0 + 51, -3)
    found = [(a.error_code, a.offset, a.timestamp) for a in answers]
    assert found == [
        (0, 5, -1),  # latest: the high watermark
        (0, 0, -1),  # earliest
        (0, 0, -1),  # earliest local
        (0, -1, -1),  # latest tiered: none, as Kafka answers without tiered storage
        (0, 1, T0 + 1),
        (0, 2, T0 + 50),  # the first record (by offset) at or after the timestamp
        (0, -1, -1),  # none that late
        (0, 2, T0 + 50),  # max timestamp: the exact record
    ]
    # the same from the object store, with empty caches
    rig.reader.close()
    rig.partition.close()
    rig.partition = rig.new_partition(CommittedSegments([first, second]), hw=5)
    rig.reader = rig.new_reader()
    answers = rig.list_offsets(T0 + 11, -3)
    assert [(a.offset, a.timestamp) for a in answers] == [(2, T0 + 50), (2, T0 + 50)]
    assert rig.store.gets >= 1
