"""S3 stopped under load: produce fails fast with a retriable error, nothing is acknowledged that
is not stored, and produce works again by itself once S3 is back."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from kafscale.protocol import records as batches
from kafscale.protocol.errors import ErrorCode
from tests.harness.stored import committed_records

from .wire import Wire

pytestmark = pytest.mark.integration

RESPONSE = load_response_schema(0, 9)


def produce(
    wire: Wire, value: bytes, correlation_id: int, timeout_ms: int = 3000
) -> tuple[ErrorCode, int]:
    schema = load_request_schema(0, 9)
    blob = batches.build_batch([(None, value, (), 1_700_000_000_000)])
    request = codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            codec.build(
                codec.nested(schema, "TopicProduceData"),
                name="outage",
                partition_data=(
                    codec.build(
                        codec.nested(schema, "PartitionProduceData"), index=0, records=blob
                    ),
                ),
            ),
        ),
    )
    wire.send(request, correlation_id)
    _, response = wire.read_response(RESPONSE)
    result = response.responses[0].partition_responses[0]
    return ErrorCode(result.error_code), int(result.base_offset)


def test_produce_is_refused_while_s3_is_down_and_resumes_after(
    start_broker: Callable[..., Any], s3_server: Any
) -> None:
    broker = start_broker(backends="real", env={"KAFSCALE_SHARDS": "1"})
    broker.wait_ready()
    acknowledged: list[bytes] = []
    with Wire(("127.0.0.1", broker.port), timeout=60) as wire:
        for i in range(5):
            error, _ = produce(wire, b"before-%d" % i, i)
            assert error == ErrorCode.none
            acknowledged.append(b"before-%d" % i)
        s3_server.stop()
        try:
            outcomes = []
            refused_fast = False
            deadline = time.monotonic() + 60
            i = 0
            while not refused_fast and time.monotonic() < deadline:
                started = time.monotonic()
                error, _ = produce(wire, b"during-%d" % i, 100 + i)
                elapsed = time.monotonic() - started
                outcomes.append(error)
                assert error != ErrorCode.none, "acknowledged while S3 was down"
                assert error.retriable, error
                refused_fast = error == ErrorCode.kafka_storage_error and elapsed < 1.0
                i += 1
            assert refused_fast, f"produce never failed fast: {outcomes}"
        finally:
            s3_server.start()
        deadline = time.monotonic() + 60
        attempt = 0
        while True:
            attempt += 1  # a distinct value per attempt: a timed-out one may still be stored
            error, _ = produce(wire, b"after-%d" % attempt, 500 + attempt)
            if error == ErrorCode.none:
                acknowledged.append(b"after-%d" % attempt)
                break
            assert error.retriable and time.monotonic() < deadline, error
            time.sleep(0.2)
    stored = [r.value for r in committed_records(broker.env, "outage", 0)]
    assert [r for r in stored if r in acknowledged] == acknowledged  # each once, in order
    assert len(stored) == len(set(stored))
