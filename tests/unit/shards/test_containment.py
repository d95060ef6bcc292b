"""An exception while a shard serves one request costs that request, never the shard: a real
``Shard`` on a real ZeroMQ socket (no flusher or coordinator behind it), requests from a DEALER
as the frontend sends them, handlers made to fail."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from kafscale import config as configuration
from kafscale.ipc import messages
from kafscale.ipc.rpc import REQUEST_ID
from kafscale.ipc.shm import sweep_segments
from kafscale.metadata.sqlite import SqliteMetadataStore
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.partition import PartitionLog
from kafscale.shards.process import Shard
from kafscale.storage.local import LocalObjectStore
from kafscale.supervisor.child import ChildContext
from tests.harness.procs import wait_until
from tests.unit.shards.owning import own

TOPIC, TOPIC_ID = "events", str(uuid.UUID(int=3))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        env = {"KAFSCALE_DATA_DIR": str(tmp_path), "KAFSCALE_SHARDS": "1"}
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
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
        self.client = self.context.socket(zmq.DEALER)
        self.client.connect(self.ctx.address())
        self.ids = 0

    def send(self, message: messages.Message, bulk: tuple[bytes, ...] = ()) -> int:
        self.ids += 1
        self.client.send_multipart([REQUEST_ID.pack(self.ids), messages.encode(message), *bulk])
        assert self.shard.server.socket.poll(10_000, zmq.POLLIN)
        self.shard._drain_requests()
        return self.ids

    def reply(self) -> tuple[int, messages.Message]:
        assert self.client.poll(10_000, zmq.POLLIN), "no reply"
        frames = self.client.recv_multipart()
        return REQUEST_ID.unpack(frames[0])[0], messages.decode(frames[1])

    def call(self, message: messages.Message, bulk: tuple[bytes, ...] = ()) -> messages.Message:
        sent = self.send(message, bulk)
        request_id, reply = self.reply()
        assert request_id == sent
        return reply

    def close(self) -> None:
        for partition in self.shard.partitions.values():
            partition.close()
        self.client.close(linger=0)
        self.shard.close()
        self.store.close()
        self.context.term()
        assert sweep_segments(self.ctx.run_id) == []


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.close()


def append(partitions: list[int]) -> tuple[messages.Append, tuple[bytes, ...]]:
    entries = [
        messages.AppendEntry(
            topic=TOPIC,
            topic_id=TOPIC_ID,
            partition=p,
            max_message_bytes=1 << 20,
            log_append_time=False,
            codec=0,
        )
        for p in partitions
    ]
    batch = records.build_batch([(None, b"value", (), 1_700_000_000_000)])
    return messages.Append(acks=1, timeout_ms=1000, entries=entries), tuple(batch for _ in entries)


def test_a_failing_request_gets_an_error_reply_and_the_shard_serves_on(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a bug in the read path")

    monkeypatch.setattr(rig.shard.reads, "on_list_offsets", broken)
    query = messages.OffsetQuery(topic=TOPIC, topic_id=TOPIC_ID, partition=0, timestamp=-1)
    reply = rig.call(messages.ListOffsets(queries=[query]))
    assert isinstance(reply, messages.ErrorReply)
    assert "ListOffsets" in reply.message and "RuntimeError" in reply.message
    assert "a bug" not in reply.message  # the exception's text stays in the log
    assert isinstance(rig.call(messages.Ping()), messages.Pong)


def test_a_failing_notice_is_not_answered(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(rig.shard, "_on_log_start_moved", broken)
    rig.send(messages.LogStartMoved(TOPIC, TOPIC_ID, 0, 5))
    # Replies come in order: the first one the client gets is the Pong, so no error was sent.
    pinged = rig.send(messages.Ping())
    request_id, reply = rig.reply()
    assert (request_id, type(reply)) == (pinged, messages.Pong)


def test_a_failing_partition_costs_only_its_own_result(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_append = PartitionLog.append

    def fails_for_partition_1(self: PartitionLog, *args: Any) -> Any:
        if self.partition == 1:
            raise ValueError("poison")
        return real_append(self, *args)

    monkeypatch.setattr(PartitionLog, "append", fails_for_partition_1)
    request, bulk = append([0, 1, 2])
    reply = rig.call(request, bulk)
    assert isinstance(reply, messages.Appended)
    codes = [(r.error_code, r.base_offset) for r in reply.results]
    assert codes == [(0, 0), (ErrorCode.unknown_server_error, -1), (0, 0)]
    assert reply.results[1].message == "ValueError"

    monkeypatch.setattr(PartitionLog, "append", real_append)
    reply = rig.call(*append([1, 0]))
    assert isinstance(reply, messages.Appended)
    # partition 1 gave out no offset for the failed batch; partition 0 carries on after its own
    assert [(r.error_code, r.base_offset) for r in reply.results] == [(0, 0), (0, 1)]


def test_a_read_completion_that_raises_does_not_stop_the_others(rig: Rig) -> None:
    finished: list[int] = []

    def done(result: Any, error: BaseException | None) -> None:
        if result == 1:
            raise RuntimeError("a bug while answering a read")
        finished.append(result)

    for n in (1, 2, 3):
        rig.shard.reads.submit(lambda n=n: n, (), done)  # reads done on the reader threads
    completed = rig.shard.reads.threads._done
    wait_until(lambda: True if completed.qsize() == 3 else None, timeout=10, what="the reads")
    rig.shard._complete_reads()
    assert sorted(finished) == [2, 3]


def test_a_failing_fetch_wake_up_does_not_fail_the_append_it_follows(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(partition: PartitionLog) -> None:
        raise RuntimeError("a bug while re-running a parked fetch")

    monkeypatch.setattr(rig.shard.reads, "appended", broken)
    request, bulk = append([0])
    reply = rig.call(request, bulk)
    assert isinstance(reply, messages.Appended)
    # The batch is in the buffer: its producer is told so (an error would make it resend it),
    # and the shard counts its bytes against the buffer budget.
    assert [(r.error_code, r.base_offset) for r in reply.results] == [(0, 0)]
    assert rig.shard.admission.unflushed == len(bulk[0])
    assert rig.shard.partitions[(TOPIC, 0)].next_offset == 1


def test_a_partition_that_cannot_load_is_a_retriable_error_without_the_backends_text(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kafscale.metadata.store import MetadataStoreError

    def unreachable(*args: Any) -> Any:
        raise MetadataStoreError("etcd at http://10.1.2.3:2379 is unreachable")

    monkeypatch.setattr(rig.shard, "_partition_for", unreachable)
    reply = rig.call(*append([0]))
    assert isinstance(reply, messages.Appended)
    [result] = reply.results
    assert result.error_code == ErrorCode.kafka_storage_error
    assert "10.1.2.3" not in (result.message or "")  # the endpoint stays in the log
