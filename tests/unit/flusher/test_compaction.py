"""The compactor against the embedded backends (a local object store, the SQLite metadata store)
and the coordinator's own commit code behind a fake RPC client: chunks of write-ahead objects
become spec segments byte-identical to ``kafscale.storage.segment``'s, the memory bound holds, and
a retry after a crash between PUT and commit reuses the objects."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.coordinator.admin import TopicAdmin
from kafscale.coordinator.compactions import CompactionCommitter
from kafscale.coordinator.partitions import PartitionCommitter
from kafscale.flusher import compact_plan
from kafscale.flusher.compact_plan import Limits
from kafscale.flusher.compaction import Compactor
from kafscale.ipc import messages, routing, write_path
from kafscale.ipc.messages import CreateTopics, TopicSpec
from kafscale.ipc.rpc import Bulk, Reply, RpcTimeout
from kafscale.ipc.write_path import CommitCompaction, CommitMerge, CommitObject, ObjectChunk
from kafscale.metadata import records as metadata_records
from kafscale.metadata.records import Keys, SegmentRecord, WalRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.metadata.store import Delete
from kafscale.protocol.records import build_batch, compress_batch
from kafscale.storage import segment as segments
from kafscale.storage import wal
from kafscale.storage.local import LocalObjectStore
from kafscale.storage.objects import ObjectNotFound
from tests.unit.leaders import ClaimedLeaders

TOKEN = "0123456789abcdef"
KEYS = Keys("ns")
OLD_MS = 1_600_000_000_000  # long past any max age
SHARDS = 4


class CountingObjects(LocalObjectStore):
    """The local store, counting GETs of write-ahead objects and created PUTs."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.wal_gets: list[str] = []
        self.created: list[str] = []

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if "/!wal/" in key:
            self.wal_gets.append(key)
        return super().get(key, start, length)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        created = super().put_if_absent(key, data)
        if created:
            self.created.append(key)
        return created


class World:
    """A topic ``t`` of two partitions, write-ahead objects committed by the coordinator's
    object committer, and compactors asking its compaction committer."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        self.objects = CountingObjects(str(tmp_path / "objects"))
        admin = TopicAdmin(self.store, self.objects, "ns", 1)
        created = admin.create(CreateTopics([TopicSpec(name="t", partitions=2)]))
        topic_id = created.results[0].topic_id
        assert topic_id is not None
        self.topic_id = topic_id
        self.leaders = ClaimedLeaders(self.store, "ns")
        self.leaders.claim("t", [0, 1])
        self.partitions = PartitionCommitter(self.store, "ns", self.leaders)
        self.compactions = CompactionCommitter(
            self.store, "ns", self.partitions.high_watermark, self.leaders
        )
        self.next_offset = {0: 0, 1: 0}
        self.batches: dict[int, list[bytes]] = {0: [], 1: []}
        self.seq = 0
        self.lost_replies = 0  # commits whose answer is lost (the commit still happens or not)
        self.commit_before_losing = False
        self.notices: list[tuple[int, messages.Message]] = []

    def compactor(
        self,
        buffer_bytes: int = 1 << 20,
        segment_bytes: int = 4096,
        owned: Callable[[], set[tuple[str, int]]] | None = None,
    ) -> Compactor:
        config = configuration.load(
            {
                "KAFSCALE_DATA_DIR": str(self.tmp_path),
                "KAFSCALE_S3_NAMESPACE": "ns",
                "KAFSCALE_SEGMENT_BYTES": str(segment_bytes),
                "KAFSCALE_COMPACTION_BUFFER_BYTES": str(buffer_bytes),
                "KAFSCALE_COMPACTION_MAX_AGE_MS": "1000",
            }
        )
        return Compactor(
            config,
            self.objects,
            self.store,
            lambda: FakeCoordinator(self),
            lambda shard, message: self.notices.append((shard, message)),
            SHARDS,
            owned=owned,
        )

    def cycle(
        self,
        batches: dict[int, int],
        created_ms: int = OLD_MS,
        codec: int = 0,
        to: Compactor | None = None,
    ) -> list[SegmentRecord]:
        """Upload and commit one object holding ``batches[p]`` 300-byte batches of each
        partition p; hand the chunks to ``to``. The chunk records, in object order."""
        inputs = []
        for partition, count in sorted(batches.items()):
            base = self.next_offset[partition]
            built = [
                compress_batch(
                    build_batch(
                        [(None, bytes([n % 251]) * 300, (), created_ms + n)], base_offset=n
                    ),
                    codec,
                )
                for n in range(base, base + count)
            ]
            self.batches[partition].extend(built)
            self.next_offset[partition] = base + count
            inputs.append(
                wal.ChunkInput(
                    "t", self.topic_id, partition, base, base + count - 1, count,
                    created_ms + base + count - 1, codec, created_ms, built,
                )
            )  # fmt: skip
        data, entries = wal.build_object(inputs, created_ms)
        key = wal.object_key("ns", 1, TOKEN, self.seq)
        self.seq += 1
        assert self.objects.put_if_absent(key, data)
        chunks = [
            SegmentRecord(
                e.base_offset, e.last_offset, e.size, 0, e.records, e.max_timestamp,
                e.created_ms, key, e.position, e.codec,
            )
            for e in entries
        ]  # fmt: skip
        wal_record = WalRecord(
            key, len(data), created_ms, 1, [("t", e.partition, e.base_offset) for e in entries]
        )
        request = CommitObject(
            wal_record,
            [
                ObjectChunk("t", self.topic_id, e.partition, chunk, {})
                for e, chunk in zip(entries, chunks, strict=True)
            ],
        )
        assert all(result.committed for result in self.partitions.commit_object(request).results)
        if to is not None:
            view = memoryview(data)
            for e, chunk in zip(entries, chunks, strict=True):
                to.committed(
                    "t",
                    self.topic_id,
                    e.partition,
                    0,
                    chunk,
                    view[e.position : e.position + e.size],
                )
        return chunks

    def entries(self, partition: int) -> list[SegmentRecord]:
        kvs = self.store.get_prefix(KEYS.segments("t", partition))
        return [metadata_records.decode_segment(kv.value) for kv in kvs]

    def expected_segment(
        self, partition: int, first: int, last: int, flags: int = 0, created_ms: int = OLD_MS
    ) -> tuple[bytes, bytes]:
        return segments.build_segment(
            self.batches[partition][first : last + 1], flags=flags, created_ms=created_ms
        )

    def stored_segment(self, partition: int, base: int) -> tuple[bytes, bytes]:
        return (
            self.objects.get(segments.segment_key("ns", "t", partition, base)),
            self.objects.get(segments.index_key("ns", "t", partition, base)),
        )


class FakeCoordinator:
    """The coordinator's compaction committer, called in-process; ``lost_replies`` commits
    time out (after committing when ``commit_before_losing``)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def call(self, message: messages.Message, bulk: Bulk = (), timeout_ms: int = 1000) -> Reply:
        if isinstance(message, CommitMerge):
            return Reply(self.world.compactions.commit_merge(message))
        assert isinstance(message, CommitCompaction)
        if self.world.lost_replies:
            self.world.lost_replies -= 1
            if self.world.commit_before_losing:
                self.world.compactions.commit(message)
            raise RpcTimeout("no reply from the coordinator")
        return Reply(self.world.compactions.commit(message))

    def close(self) -> None:
        pass


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    yield made
    made.store.close()


def run_until_idle(compactor: Compactor, rounds: int = 50) -> int:
    done = 0
    for _ in range(rounds):
        if not (jobs := compactor.run_once()):
            return done
        done += jobs
    raise AssertionError("the compactor never went idle")


def spans(entries: Sequence[SegmentRecord]) -> list[tuple[int, int, bool]]:
    return [(e.base_offset, e.last_offset, e.is_chunk) for e in entries]


# --- sealing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [0, 1])
def test_aged_chunks_become_one_spec_segment_byte_identical_to_build_segment(
    world: World, codec: int
) -> None:
    compactor = world.compactor()
    for _ in range(3):
        world.cycle({0: 2, 1: 1}, codec=codec, to=compactor)
    assert run_until_idle(compactor) == 2  # one seal per partition
    kfs, index = world.stored_segment(0, 0)
    assert (kfs, index) == world.expected_segment(0, 0, 5, flags=codec)
    parsed = segments.parse_segment(kfs, verify=True)
    assert (parsed.base_offset, parsed.last_offset, parsed.flags) == (0, 5, codec)
    assert spans(world.entries(0)) == [(0, 5, False)] and spans(world.entries(1)) == [(0, 2, False)]
    record = world.entries(0)[0]
    assert (record.size, record.index_size, record.records, record.object) == (
        len(kfs),
        len(index),
        6,
        "",
    )
    assert compactor.held_bytes == 0 and world.objects.wal_gets == []  # nothing read back
    shard = routing.shard_for(world.topic_id, 0, SHARDS)
    assert (shard, write_path.SegmentsCompacted("t", world.topic_id, 0, record)) in world.notices


def test_young_chunks_wait_until_they_fill_segment_bytes(world: World) -> None:
    compactor = world.compactor(segment_bytes=1024)
    young = 2**62  # never aged
    world.cycle({0: 1}, created_ms=young, to=compactor)
    world.cycle({0: 1}, created_ms=young, to=compactor)
    assert compactor.run_once() == 0
    world.cycle({0: 2}, created_ms=young, to=compactor)  # the next chunk does not fit: closed
    run_until_idle(compactor)
    assert spans(world.entries(0)) == [(0, 1, False), (2, 3, True)]
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 1, created_ms=young)


def test_a_codec_change_cuts_the_segment(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 1}, codec=0, to=compactor)
    world.cycle({0: 1}, codec=4, to=compactor)
    run_until_idle(compactor)
    assert spans(world.entries(0)) == [(0, 0, False), (1, 1, False)]
    assert segments.parse_segment(world.stored_segment(0, 1)[0]).flags == 4


# --- reading chunks back ------------------------------------------------------------------------


def test_after_a_restart_chunks_are_read_back_with_one_get_per_object(world: World) -> None:
    for _ in range(4):
        world.cycle({0: 1, 1: 2})
    compactor = world.compactor()
    compactor.load_entries()
    run_until_idle(compactor)
    assert sorted(world.objects.wal_gets) == sorted(set(world.objects.wal_gets))
    assert len(world.objects.wal_gets) == 4
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 3)
    assert world.stored_segment(1, 0) == world.expected_segment(1, 0, 7)


def test_only_the_partitions_this_broker_owns_are_compacted(world: World) -> None:
    for _ in range(4):
        world.cycle({0: 1, 1: 2})
    owned = {("t", 0)}
    compactor = world.compactor(owned=lambda: set(owned))
    compactor.load_entries()
    assert compactor.uncompacted("t", 1) == []  # another broker's to compact
    assert len(compactor.uncompacted("t", 0)) == 4
    owned = {("t", 1)}  # partition 1 moved here (a failover), partition 0 away
    compactor._follow_owners()
    assert compactor.uncompacted("t", 0) == [] and len(compactor.uncompacted("t", 1)) == 4
    run_until_idle(compactor)
    assert world.stored_segment(1, 0) == world.expected_segment(1, 0, 7)
    chunks_of_0 = world.store.get_prefix(world.leaders.keys.segments("t", 0))
    assert len(chunks_of_0) == 4  # untouched: not ours
    assert world.objects.list("ns/t/0/") == []


def test_the_memory_bound_holds_and_everything_is_compacted(world: World) -> None:
    bound = 2000  # about six 300-byte batches
    compactor = world.compactor(buffer_bytes=bound)
    for _ in range(6):
        world.cycle({0: 2, 1: 3}, created_ms=2**62, to=compactor)
        assert compactor.held_bytes <= bound
    for _ in range(50):
        if not compactor.run_once():
            break
        assert compactor.held_bytes <= bound
    # over the bound, segments were sealed (memory rule) and the rest read back within it
    # then every chunk ages (they were created at 2**62: a max age of -2**62 has them all due)
    compactor.limits = Limits(bound, -(2**62), compactor.limits.max_jobs)
    for _ in range(50):
        if not compactor.run_once():
            break
        assert compactor.held_bytes <= bound
    for partition, last in ((0, 11), (1, 17)):
        entries = world.entries(partition)
        assert not any(e.is_chunk for e in entries)
        assert entries[0].base_offset == 0 and entries[-1].last_offset == last
        for before, after in itertools.pairwise(entries):
            assert after.base_offset == before.last_offset + 1
        for entry in entries:
            kfs, index = world.stored_segment(partition, entry.base_offset)
            assert (kfs, index) == world.expected_segment(
                partition, entry.base_offset, entry.last_offset, created_ms=2**62
            )


def test_a_sweep_reads_the_merged_chunks_of_its_partitions_with_one_get_per_object(
    world: World,
) -> None:
    bound = 6000  # a cycle brings 2,960 bytes: a merge every four cycles
    compactor = world.compactor(buffer_bytes=bound, segment_bytes=1 << 20)
    for _ in range(12):
        world.cycle({0: 2, 1: 2}, created_ms=2**62, to=compactor)
        while compactor.run_once():
            pass
    merged = {
        e.object for p in (0, 1) for e in world.entries(p) if e.is_chunk and TOKEN not in e.object
    }
    in_merged = [e for p in (0, 1) for e in world.entries(p) if e.object in merged]
    assert len(merged) == 3 and len(in_merged) == 6  # each holds a chunk of both partitions
    world.objects.wal_gets.clear()
    compactor.limits = dataclasses.replace(compactor.limits, max_age_ms=-(2**62))
    run_until_idle(compactor)
    # each merged object read once, whatever the number of its chunks; nothing else read
    assert sorted(world.objects.wal_gets) == sorted(merged)
    for partition in (0, 1):
        (entry,) = world.entries(partition)
        assert not entry.is_chunk and (entry.base_offset, entry.last_offset) == (0, 23)
        assert world.stored_segment(partition, 0) == world.expected_segment(
            partition, 0, 23, created_ms=2**62
        )


def test_a_merged_chunk_that_does_not_verify_fails_only_its_seal(world: World) -> None:
    compactor = world.compactor(buffer_bytes=4000, segment_bytes=1 << 20)
    for _ in range(12):
        world.cycle({0: 2, 1: 2}, created_ms=2**62, to=compactor)
        while compactor.run_once():
            pass
    chunk = next(e for e in world.entries(1) if e.is_chunk and TOKEN not in e.object)
    path = Path(world.objects.root) / chunk.object
    data = bytearray(path.read_bytes())
    data[chunk.position + chunk.size - 1] ^= 0xFF  # the last byte of partition 1's chunk
    path.write_bytes(bytes(data))
    compactor.limits = dataclasses.replace(compactor.limits, max_age_ms=-(2**62))
    compactor.run_once()
    assert not any(e.is_chunk for e in world.entries(0))  # sealed
    assert any(e.is_chunk for e in world.entries(1))  # refused: its bytes are not its chunk's
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 23, created_ms=2**62)


# --- retries ------------------------------------------------------------------------------------


def test_a_retry_after_a_crash_between_put_and_commit_reuses_the_objects(world: World) -> None:
    first = world.compactor()
    world.cycle({0: 2}, to=first)
    world.cycle({0: 2}, to=first)
    world.lost_replies = 1
    assert first.run_once() == 1  # the seal failed after its PUTs
    kfs, index = world.stored_segment(0, 0)
    created = list(world.objects.created)
    second = world.compactor()  # the flusher was restarted
    second.load_entries()
    run_until_idle(second)
    assert world.stored_segment(0, 0) == (kfs, index) == world.expected_segment(0, 0, 3)
    assert [key for key in world.objects.created if key not in created] == []  # nothing new
    assert spans(world.entries(0)) == [(0, 3, False)]
    assert compacted(world) == [(0, 3)]


def test_a_retry_after_a_lost_answer_finds_the_segment_committed(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 2}, to=compactor)
    world.lost_replies, world.commit_before_losing = 1, True
    compactor.run_once()
    assert spans(world.entries(0)) == [(0, 1, False)] and compacted(world) == []
    states, _ = compactor.accumulator.states(float("inf"))  # past the back-off
    (job,) = compact_plan.plan(states, compactor.limits, OLD_MS * 2)
    compactor.run_job(job)
    assert compacted(world) == [(0, 1)] and compactor.uncompacted("t", 0) == []


def compacted(world: World) -> list[tuple[int, int]]:
    """The spans of the SegmentsCompacted notices the shards got."""
    notices = [m for _, m in world.notices if isinstance(m, write_path.SegmentsCompacted)]
    return [(m.segment.base_offset, m.segment.last_offset) for m in notices]


def test_a_retry_with_more_chunks_commits_the_segment_it_uploaded_before(world: World) -> None:
    first = world.compactor()
    world.cycle({0: 2}, to=first)
    world.lost_replies = 1
    first.run_once()
    world.cycle({0: 2})  # arrives while the flusher restarts
    second = world.compactor()
    second.load_entries()
    run_until_idle(second)
    assert spans(world.entries(0)) == [(0, 1, False), (2, 3, False)]
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 1)
    assert world.stored_segment(0, 2) == world.expected_segment(0, 2, 3)


def test_a_longer_uncommitted_attempt_is_replaced_when_the_run_got_shorter(world: World) -> None:
    first = world.compactor()
    world.cycle({0: 2}, to=first)
    world.cycle({0: 2}, to=first)
    world.lost_replies = 1
    first.run_once()  # uploaded 0..3, never committed
    second = world.compactor(segment_bytes=1024)  # restarted with a smaller segment.bytes
    second.load_entries()
    run_until_idle(second)
    assert spans(world.entries(0)) == [(0, 1, False), (2, 3, False)]
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 1)


def test_another_segment_under_the_key_is_never_overwritten(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 2}, to=compactor)
    # sealed after the topic was created, of other chunks: another writer's, never ours to touch
    theirs, _ = segments.build_segment(world.batches[0][:1], flags=0, created_ms=2**62)
    key = segments.segment_key("ns", "t", 0, 0)
    world.objects.put_if_absent(key, theirs)
    compactor.run_once()
    assert world.objects.get(key) == theirs
    assert spans(world.entries(0)) == [(0, 1, True)]  # not compacted, the chunk stays readable


def test_a_deleted_topics_leftover_under_the_key_is_replaced(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 2}, to=compactor)
    leftover, _ = segments.build_segment(world.batches[0][:1], flags=0, created_ms=OLD_MS - 7)
    world.objects.put_if_absent(segments.segment_key("ns", "t", 0, 0), leftover)
    run_until_idle(compactor)
    assert world.stored_segment(0, 0) == world.expected_segment(0, 0, 1)
    assert spans(world.entries(0)) == [(0, 1, False)]


def test_a_refused_commit_reloads_the_entries_and_removes_what_it_uploaded(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 1}, to=compactor)
    world.cycle({0: 1}, to=compactor)
    world.store.transaction([], [Delete(KEYS.segment("t", 0, 0))])  # retention
    assert compactor.run_once() == 1
    assert [key for key in world.objects.created if key.endswith(".kfs")] != []
    with pytest.raises(ObjectNotFound):
        world.objects.get(segments.segment_key("ns", "t", 0, 0))
    assert [c.base_offset for c in compactor.uncompacted("t", 0)] == [1]
    run_until_idle(compactor)
    assert spans(world.entries(0)) == [(1, 1, False)]


def test_a_deleted_topic_is_forgotten(world: World) -> None:
    compactor = world.compactor()
    world.cycle({0: 1}, to=compactor)
    world.store.transaction([], [Delete(KEYS.topic("t"))])
    compactor.run_once()
    assert compactor.uncompacted("t", 0) == [] and compactor.held_bytes == 0


def test_the_worker_thread_compacts_what_the_flusher_hands_it(world: World) -> None:
    done = threading.Event()

    def notify(shard: int, message: messages.Message) -> None:
        assert isinstance(message, write_path.SegmentsCompacted)
        if message.segment.last_offset == 1:
            done.set()

    compactor = world.compactor()
    compactor._notify = notify
    world.cycle({0: 1})  # committed before the start: read from the store
    compactor.start()
    world.cycle({0: 1}, to=compactor)
    assert done.wait(30)
    compactor.close()
    entries = world.entries(0)  # one segment, or two if the first was sealed before the second came
    assert not any(e.is_chunk for e in entries) and entries[-1].last_offset == 1
