"""The read path's object-store gate, with a clock the test moves."""

from __future__ import annotations

from kafscale.protocol.errors import ErrorCode
from kafscale.shards.gate import READ_BACKOFF_MS, ReadGate
from kafscale.storage.objects import ObjectNotFound, ObjectStoreUnavailable
from kafscale.storage.segment import CorruptBatch, CorruptSegment


class Clock:
    ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def test_a_store_failure_refuses_reads_until_a_probe_succeeds() -> None:
    clock = Clock()
    gate = ReadGate("t", clock)
    assert gate.refusal() is None
    code, message = gate.failure("k", ObjectStoreUnavailable("http://minio:9000 refused"))
    assert code == ErrorCode.kafka_storage_error and "minio" not in message
    assert gate.refusal() is not None  # within the backoff
    clock.ms += READ_BACKOFF_MS
    assert gate.refusal() is None  # the probe goes
    assert gate.refusal() is not None  # only one probe at a time
    gate.failure("k", ObjectStoreUnavailable("still down"))  # the probe failed: back off again
    clock.ms += READ_BACKOFF_MS - 1
    assert gate.refusal() is not None
    clock.ms += 1
    assert gate.refusal() is None
    gate.healthy()
    assert not gate.degraded and gate.refusal() is None


def test_a_probe_answered_without_news_lets_the_next_read_probe() -> None:
    clock = Clock()
    gate = ReadGate("t", clock)
    gate.failure("k", ObjectStoreUnavailable("down"))
    clock.ms += READ_BACKOFF_MS
    assert gate.refusal() is None
    gate.answered()  # e.g. a chunk's object gone: the store answered, nothing is known yet
    assert gate.refusal() is None


def test_faults_of_the_data_leave_the_gate_open() -> None:
    gate = ReadGate("t", Clock())
    code, message = gate.failure("ns/t/0/segment.kfs", CorruptSegment("bad CRC"))
    assert code == ErrorCode.kafka_storage_error and "ns/t/0" not in message
    code, message = gate.failure("k", CorruptBatch("ns/t/0/x.kfs", "offsets 3..4 do not decode"))
    assert message.endswith("offsets 3..4 do not decode") and "x.kfs" not in message
    gate.failure("k", ObjectNotFound("k"))
    assert not gate.degraded and gate.refusal() is None
    code, _ = gate.failure("k", RuntimeError("a bug"))
    assert code == ErrorCode.unknown_server_error
