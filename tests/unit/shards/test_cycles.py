"""A real ``Shard`` on real ZeroMQ sockets takes part in flush cycles: a stand-in flusher (a
ROUTER at the flusher's address for the shard's notices, a DEALER to the shard for ``Cut`` and
``ObjectCommitted``) and a stand-in frontend; no flusher or coordinator behind them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from kafscale import config as configuration
from kafscale.ipc import endpoints, messages, write_path
from kafscale.ipc.rpc import REQUEST_ID
from kafscale.ipc.shm import sweep_segments
from kafscale.metadata.records import SegmentRecord
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.process import Shard, now_ms
from kafscale.storage.local import LocalObjectStore
from kafscale.supervisor.child import ChildContext
from tests.unit.shards.owning import own

TOPIC, TOPIC_ID = "events", str(uuid.UUID(int=5))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"}
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.notices = self.context.socket(zmq.ROUTER)  # the flusher's own endpoint
        self.notices.bind(endpoints.address(str(tmp_path), "flusher"))
        self.store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
        lease = self.store.grant_lease(600)  # the broker lease, as the supervisor holds it
        own(self.store, TOPIC, range(8), lease.id)
        self.ctx = ChildContext(
            config=configuration.load(env),
            role="shard",
            index=0,
            runtime_dir=str(tmp_path),
            run_id=uuid.uuid4().hex[:12],
            zmq_context=self.context,
            lease_id=lease.id,
        )
        self.shard = Shard(self.ctx, self.store, LocalObjectStore(str(tmp_path / "objects")))
        self.frontend = self._dealer()
        self.flusher = self._dealer()
        self.ids = 0

    def _dealer(self) -> zmq.Socket[bytes]:
        socket = self.context.socket(zmq.DEALER)
        socket.connect(self.ctx.address())
        return socket

    def send(self, socket: zmq.Socket[bytes], message: messages.Message, *bulk: bytes) -> None:
        self.ids += 1
        socket.send_multipart([REQUEST_ID.pack(self.ids), messages.encode(message), *bulk])
        assert self.shard.server.socket.poll(10_000, zmq.POLLIN)
        self.shard._drain_requests()

    def reply(self, socket: zmq.Socket[bytes], timeout_ms: int = 10_000) -> messages.Message | None:
        if not socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return messages.decode(socket.recv_multipart()[1])

    def append(self, acks: int = 1, partition: int = 0) -> None:
        entry = messages.AppendEntry(
            topic=TOPIC,
            topic_id=TOPIC_ID,
            partition=partition,
            max_message_bytes=1 << 20,
            log_append_time=False,
            codec=0,
        )
        batch = records.build_batch([(None, b"value", (), 1_700_000_000_000)])
        self.send(
            self.frontend, messages.Append(acks=acks, timeout_ms=30_000, entries=[entry]), batch
        )

    def appended(self) -> messages.AppendResult:
        reply = self.reply(self.frontend)
        assert isinstance(reply, messages.Appended)
        [result] = reply.results
        return result

    def notice(self, timeout_ms: int = 2_000) -> write_path.ShardPending | None:
        self.shard._tick(now_ms())
        if not self.notices.poll(timeout_ms, zmq.POLLIN):
            return None
        frames = self.notices.recv_multipart()  # identity, request id 0, the notice
        assert REQUEST_ID.unpack(frames[1]) == (0,)
        notice = messages.decode(frames[2])
        assert isinstance(notice, write_path.ShardPending)
        return notice

    def cut(self, cycle: int) -> list[write_path.WalEntry]:
        self.send(self.flusher, write_path.Cut(cycle))
        reply = self.reply(self.flusher)
        assert isinstance(reply, write_path.CutEntries)
        assert (reply.cycle, reply.shard) == (cycle, 0)
        return reply.entries

    def answer(self, cycle: int, *results: write_path.EntryResult) -> None:
        self.send(self.flusher, write_path.ObjectCommitted(cycle, list(results)))

    def close(self) -> None:
        for partition in self.shard.partitions.values():
            partition.close()
        for socket in (self.frontend, self.flusher, self.notices):
            socket.close(linger=0)
        self.shard.close()
        self.store.close()
        self.context.term()
        assert sweep_segments(self.ctx.run_id) == []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()


def committed(entry: write_path.WalEntry, **fields: Any) -> write_path.EntryResult:
    chunk = SegmentRecord(
        entry.base_offset, entry.last_offset, entry.size, 0, entry.records,
        entry.max_timestamp, entry.created_ms, object="ns/!wal/0/t/0000000000.wal", position=32,
    )  # fmt: skip
    return write_path.EntryResult(
        entry.topic, entry.partition, entry.base_offset, True, entry.last_offset + 1,
        segment=chunk, **fields,
    )  # fmt: skip


def refused(entry: write_path.WalEntry, **fields: Any) -> write_path.EntryResult:
    return write_path.EntryResult(
        entry.topic, entry.partition, entry.base_offset, False, error="no", **fields
    )


def test_pending_data_is_reported_cut_and_committed(rig: Rig) -> None:
    assert rig.notice(timeout_ms=100) is None  # nothing pending
    rig.append()
    assert rig.appended().base_offset == 0
    notice = rig.notice()
    assert notice is not None and notice.shard == 0 and notice.bytes > 0 and notice.urgent_ms == -1
    rig.append()
    rig.appended()
    assert rig.notice(timeout_ms=100) is None  # not on every append
    [entry] = rig.cut(1)
    assert (entry.topic, entry.topic_id, entry.base_offset, entry.last_offset) == (
        TOPIC,
        TOPIC_ID,
        0,
        1,
    )
    assert entry.segment_bytes == rig.ctx.config.segment_bytes
    assert rig.cut(2) == []  # held by cycle 1
    partition = rig.shard.partitions[(TOPIC, 0)]
    rig.answer(1, committed(entry))
    assert partition.high_watermark == 2 and not partition.sealed
    assert rig.shard.admission.unflushed == 0
    assert partition.segments.find(1) is not None  # the read path knows the chunk


def test_an_acks_all_request_is_urgent_and_answered_after_the_commit(rig: Rig) -> None:
    rig.append(acks=-1)
    notice = rig.notice()
    assert notice is not None and notice.urgent_ms >= 0
    [entry] = rig.cut(1)
    assert rig.reply(rig.frontend, timeout_ms=50) is None  # waits for the commit
    rig.answer(1, committed(entry))
    assert rig.appended().base_offset == 0


def test_a_buffer_not_committed_is_offered_again_and_produce_is_refused_meanwhile(
    rig: Rig,
) -> None:
    rig.append()
    rig.appended()
    [first] = rig.cut(1)
    rig.append()  # a second buffer, in another cycle
    rig.appended()
    [second] = rig.cut(2)
    rig.answer(1, refused(first, storage_error=True))
    rig.append()
    assert rig.appended().error_code == ErrorCode.kafka_storage_error
    # Cycle 2's entry would be refused for not starting at the high watermark: given back too.
    rig.answer(2, committed(second))
    assert rig.shard.partitions[(TOPIC, 0)].high_watermark == 0
    assert rig.cut(3) == [first, second]
    rig.answer(3, committed(first), committed(second))
    assert rig.shard.partitions[(TOPIC, 0)].high_watermark == 2
    rig.append()
    assert rig.appended().base_offset == 2


def test_a_cycle_unanswered_in_time_is_given_back(rig: Rig) -> None:
    rig.append()
    rig.appended()
    [entry] = rig.cut(1)
    rig.shard.cycles.holds.timeout_ms = 0  # as if 10 s passed
    rig.shard._tick(now_ms())
    rig.append()
    assert rig.appended().error_code == ErrorCode.kafka_storage_error  # refused meanwhile
    assert rig.cut(2) == [entry]  # the flusher's successor gets it
    rig.answer(1, committed(entry))  # the lost cycle's late answer
    assert rig.shard.partitions[(TOPIC, 0)].high_watermark == 0
    rig.answer(2, committed(entry))
    assert rig.shard.partitions[(TOPIC, 0)].high_watermark == 1


def test_a_topic_gone_drops_the_partition(rig: Rig) -> None:
    rig.append()
    rig.appended()
    [entry] = rig.cut(1)
    rig.answer(1, refused(entry, topic_gone=True))
    assert (TOPIC, 0) not in rig.shard.partitions
    assert rig.shard.admission.unflushed == 0 and rig.shard.cycles.holds.held_bytes == 0


def test_compacted_chunks_are_replaced_by_their_segment(rig: Rig) -> None:
    entries = []
    for cycle in (1, 2):
        rig.append()
        rig.appended()
        [entry] = rig.cut(cycle)
        rig.answer(cycle, committed(entry))
        entries.append(entry)
    segment = SegmentRecord(0, 1, 300, 24, 2, entries[-1].max_timestamp, entries[0].created_ms)
    rig.send(rig.flusher, write_path.SegmentsCompacted(TOPIC, TOPIC_ID, 0, segment))
    assert rig.shard.partitions[(TOPIC, 0)].segments.find(1) == segment


def test_a_flush_waits_for_everything_appended(rig: Rig) -> None:
    rig.append()
    rig.appended()
    rig.send(rig.frontend, messages.FlushAll())
    notice = rig.notice()
    assert notice is not None and notice.urgent_ms >= 0
    [entry] = rig.cut(1)
    rig.answer(1, committed(entry))
    assert rig.reply(rig.frontend) == messages.FlushedAll(partitions=1)
