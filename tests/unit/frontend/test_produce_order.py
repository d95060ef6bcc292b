"""Pipelined Produce requests reach every shard in request order (Kafka appends a connection's
requests in order; an idempotent producer's batches to one partition depend on it)."""

import asyncio
import datetime
import uuid
from collections.abc import Sequence
from typing import Any, cast

from kio.index import load_request_schema

from kafscale import config as configuration
from kafscale.frontend import requests
from kafscale.frontend.context import Broker
from kafscale.frontend.dispatch import APIS
from kafscale.ipc import messages
from kafscale.metadata.records import BrokerRecord, LeaderRecord, TopicRecord
from kafscale.metadata.view import Snapshot
from kafscale.protocol import codec
from tests.unit.frontend.test_requests import FakeCoordinator, StaticView, decode_response
from tests.unit.protocol.test_codec import request_frame


class RecordingShards:
    """Partition p belongs to shard p % 2. Like the RPC client, an append is sent (recorded)
    in the first step of its coroutine and answered later."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []  # (partition, records) in the order sent
        self.offsets: dict[int, int] = {}

    def owner(self, topic_id: str, partition: int) -> int:
        return partition % 2

    async def append(
        self,
        shard: int,
        request: messages.Append,
        records: Sequence[bytes],
        timeout: float,
    ) -> messages.Appended:
        results = []
        for entry, data in zip(request.entries, records, strict=True):
            self.sent.append((entry.partition, bytes(data)))
            offset = self.offsets.get(entry.partition, 0)
            self.offsets[entry.partition] = offset + 1
            results.append(messages.AppendResult(base_offset=offset))
        await asyncio.sleep(0)  # the shard's reply comes back later
        return messages.Appended(results=results)


def produce_frame(correlation_id: int, batches: dict[int, bytes]) -> bytes:
    schema = load_request_schema(0, 9)
    partitions = tuple(
        codec.build(codec.nested(schema, "PartitionProduceData"), index=p, records=data)
        for p, data in batches.items()
    )
    topic = codec.build(
        codec.nested(schema, "TopicProduceData"), name="orders", partition_data=partitions
    )
    request = codec.build(
        schema,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(topic,),
    )
    return request_frame(request, correlation_id=correlation_id)


def test_a_single_shard_request_never_overtakes_an_earlier_request_to_two_shards() -> None:
    config = configuration.load({"KAFSCALE_BROKER_ID": "3", "KAFSCALE_BROKER_PORT": "19092"})
    snapshot = Snapshot(
        revision=5,
        cluster_id="abcdefghijklmnopqrstuv",
        brokers={3: BrokerRecord(node_id=3, host="127.0.0.1", port=19092)},
        topics={"orders": TopicRecord(name="orders", topic_id=str(uuid.uuid4()), partitions=2)},
        leaders={
            ("orders", p): LeaderRecord(owner=3, epoch=0, lease=1, run_id="r") for p in (0, 1)
        },
    )
    view = StaticView(snapshot)
    shards = RecordingShards()
    # Fakes of the two RPC clients: only what Produce uses.
    broker = Broker(config, view, APIS, cast(Any, FakeCoordinator(view)), cast(Any, shards))
    first = produce_frame(1, {0: b"first-p0", 1: b"first-p1"})
    second = produce_frame(2, {0: b"second-p0"})

    async def pipelined() -> list[Any]:
        # As a connection does: one task per frame, made in arrival order.
        tasks = [
            asyncio.create_task(requests.process(broker, frame, "test:1"))
            for frame in (first, second)
        ]
        return list(await asyncio.gather(*tasks))

    answers = asyncio.run(pipelined())
    assert [data for partition, data in shards.sent if partition == 0] == [
        b"first-p0",
        b"second-p0",
    ]
    offsets = [
        {
            p.index: p.base_offset
            for t in decode_response(answer, 0, 9)[1].responses
            for p in t.partition_responses
        }
        for answer in answers
    ]
    assert offsets == [{0: 0, 1: 0}, {0: 1}]
