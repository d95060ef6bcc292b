"""The flusher's I/O shell against a fake shard and a fake coordinator over real ZeroMQ sockets,
real shared-memory buffers and the local object store: a cycle from report to answer."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator

import msgspec
import pytest
import zmq

from kafscale import config as configuration
from kafscale.flusher import objects
from kafscale.flusher.process import Flusher
from kafscale.ipc import endpoints, messages, write_path
from kafscale.ipc.rpc import REQUEST_ID, RpcClient, RpcServer
from kafscale.ipc.shm import PartitionBuffer, segment_name, sweep_segments
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol.records import build_batch
from kafscale.storage import wal
from kafscale.storage.local import LocalObjectStore
from kafscale.supervisor.child import ChildContext

TOPIC_ID = "6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c"
WAIT_MS = 10_000

Answerer = Callable[[write_path.CommitObject], messages.Message]


def all_committed(request: write_path.CommitObject) -> messages.Message:
    return write_path.ObjectCommitResult(
        results=[
            write_path.ChunkCommitted(
                c.topic, c.partition, c.chunk.base_offset, True, c.chunk.last_offset + 1
            )
            for c in request.chunks
        ]
    )


class FakeCoordinator:
    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], runtime_dir: str) -> None:
        self.server = RpcServer(context, endpoints.address(runtime_dir, "coordinator"))
        self.requests: list[write_path.CommitObject] = []
        self.answer: Answerer = all_committed
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            incoming = self.server.recv(20)
            if incoming is not None and isinstance(incoming.message, write_path.CommitObject):
                self.requests.append(incoming.message)
                self.server.reply(incoming, self.answer(incoming.message))

    def close(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.server.close()


class Rig:
    def __init__(self) -> None:
        self.runtime_dir = tempfile.mkdtemp(prefix="kf", dir="/tmp")  # short ipc:// paths
        self.run_id = uuid.uuid4().hex[:12]
        environ = {
            "KAFSCALE_DATA_DIR": self.runtime_dir,
            "KAFSCALE_SHARDS": "1",
            "KAFSCALE_FLUSH_INTERVAL_MS": "10",
        }
        self.config = configuration.load(environ)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ctx = ChildContext(
            self.config, "flusher", 0, self.runtime_dir, self.run_id, self.context
        )
        self.objects = LocalObjectStore(self.runtime_dir + "/objects")
        self.coordinator = FakeCoordinator(self.context, self.runtime_dir)
        self.shard = RpcServer(self.context, endpoints.address(self.runtime_dir, "shard", 0))
        self.flusher = Flusher(self.ctx, self.objects)
        self.thread = threading.Thread(target=self.flusher.serve, daemon=True)
        self.thread.start()
        self.to_flusher = self.context.socket(zmq.DEALER)
        self.to_flusher.connect(self.ctx.address())
        self.buffers: list[PartitionBuffer] = []

    def report(self, nbytes: int = 100) -> None:
        notice = write_path.ShardPending(shard=0, bytes=nbytes, oldest_ms=1, urgent_ms=-1)
        self.to_flusher.send_multipart([REQUEST_ID.pack(0), messages.encode(notice)])

    def entry(self, partition: int, count: int = 3) -> write_path.WalEntry:
        rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
        rows = [(None, b"value-%d" % i, [], 1_700_000_000_000 + i) for i in range(count)]
        batch = build_batch(rows)
        buffer = PartitionBuffer.create(segment_name(self.run_id, 0, len(self.buffers)), 4096)
        self.buffers.append(buffer)
        buffer.append(batch, records=count)
        buffer.seal(sealed_ms=1_700_000_000_000)
        return write_path.WalEntry(
            buffer=buffer.name,
            generation=buffer.generation,
            size=len(batch),
            topic="t",
            topic_id=TOPIC_ID,
            partition=partition,
            base_offset=0,
            last_offset=count - 1,
            records=count,
            max_timestamp=1_700_000_000_000 + count - 1,
            created_ms=1_700_000_000_000,
            codec=0,
            producers={},
        )

    def next_message(self) -> tuple[messages.Message, bytes, bytes]:
        incoming = self.shard.recv(WAIT_MS)
        assert incoming is not None, "the flusher sent nothing to the shard"
        return incoming.message, incoming.identity, incoming.request_id

    def answer_cut(self, entries: list[write_path.WalEntry]) -> int:
        incoming = self.shard.recv(WAIT_MS)
        assert incoming is not None and isinstance(incoming.message, write_path.Cut)
        cycle = incoming.message.cycle
        self.shard.reply(incoming, write_path.CutEntries(cycle=cycle, shard=0, entries=entries))
        return cycle

    def outcome(self) -> write_path.ObjectCommitted:
        incoming = self.shard.recv(WAIT_MS)
        assert incoming is not None and isinstance(incoming.message, write_path.ObjectCommitted)
        return incoming.message

    def close(self) -> None:
        self.ctx.stopping.set()
        self.thread.join(WAIT_MS / 1000)
        assert not self.thread.is_alive(), "the flusher did not stop"
        self.flusher.close()
        self.coordinator.close()
        self.shard.close()
        self.to_flusher.close(linger=0)
        for buffer in self.buffers:
            buffer.destroy()
        sweep_segments(self.run_id)
        self.context.term()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.close()


def test_a_report_is_cut_uploaded_committed_and_answered(rig: Rig) -> None:
    rig.report()
    entries = [rig.entry(1), rig.entry(0)]
    cycle = rig.answer_cut(entries)
    outcome = rig.outcome()
    assert outcome.cycle == cycle
    assert [(r.partition, r.committed, r.high_watermark) for r in outcome.results] == [
        (1, True, 3),
        (0, True, 3),
    ]
    (request,) = rig.coordinator.requests
    key = request.wal.key
    assert request.wal.broker_id == rig.config.broker_id
    assert wal.parse_object_key(key) is not None
    assert [r.segment.object if r.segment else None for r in outcome.results] == [key, key]
    parsed = wal.parse_object(rig.objects.get(key))
    assert [e.partition for e in parsed.entries] == [0, 1]
    assert request.wal.entries == [("t", 0, 0), ("t", 1, 0)]


def test_a_coordinator_that_cannot_commit_makes_storage_errors(rig: Rig) -> None:
    rig.coordinator.answer = lambda request: messages.ErrorReply(message="etcd is down")
    rig.report()
    rig.answer_cut([rig.entry(0)])
    (result,) = rig.outcome().results
    assert not result.committed and result.storage_error
    assert result.error is not None and "etcd is down" in result.error


def test_a_cut_that_gathers_nothing_uploads_nothing_and_the_next_report_is_cut(rig: Rig) -> None:
    rig.report()
    first = rig.answer_cut([])
    rig.report()
    second = rig.answer_cut([rig.entry(0)])
    assert second > first
    assert rig.outcome().cycle == second
    assert len(rig.coordinator.requests) == 1


def test_stopping_finishes_the_cycle_in_flight(rig: Rig) -> None:
    rig.report()
    incoming = rig.shard.recv(WAIT_MS)
    assert incoming is not None and isinstance(incoming.message, write_path.Cut)
    rig.ctx.stopping.set()
    cycle = incoming.message.cycle
    rig.shard.reply(incoming, write_path.CutEntries(cycle=cycle, shard=0, entries=[rig.entry(0)]))
    assert rig.outcome().results[0].committed
    rig.thread.join(WAIT_MS / 1000)
    assert not rig.thread.is_alive()


def test_pings_are_answered(rig: Rig) -> None:
    client = RpcClient(rig.context, rig.ctx.address())
    try:
        assert isinstance(client.call(messages.Ping(), timeout_ms=WAIT_MS).message, messages.Pong)
    finally:
        client.close()


class Sink:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, int, int, int, bytes]] = []

    def committed(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        segment_bytes: int,
        record: SegmentRecord,
        data: bytes | memoryview,
    ) -> None:
        self.chunks.append((topic, partition, segment_bytes, record.size, bytes(data)))


def test_committed_chunks_go_to_the_compactor_and_refused_ones_do_not(rig: Rig) -> None:
    sink = Sink()
    rig.flusher.compactor = sink

    def refuse_partition_1(request: write_path.CommitObject) -> messages.Message:
        answer = all_committed(request)
        assert isinstance(answer, write_path.ObjectCommitResult)
        return write_path.ObjectCommitResult(
            results=[
                msgspec.structs.replace(r, committed=False) if r.partition == 1 else r
                for r in answer.results
            ]
        )

    rig.coordinator.answer = refuse_partition_1
    rig.report()
    rig.answer_cut([rig.entry(0), rig.entry(1)])
    assert [r.committed for r in rig.outcome().results] == [True, False]
    ((topic, partition, segment_bytes, size, data),) = sink.chunks
    assert (topic, partition, segment_bytes) == ("t", 0, rig.config.segment_bytes)
    assert len(data) == size and data == bytes(objects.split_batches(data)[0])
