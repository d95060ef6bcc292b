"""DeleteRecords and DescribeLogDirs from request bytes to response bytes, with the broker's
view and coordinator faked (tests/unit/frontend/test_acls_enforced.py's): which partitions reach
the coordinator, what each answer carries, which partitions a broker describes."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from kio.index import load_request_schema

from kafscale.frontend.log_dirs import LogDir
from kafscale.metadata.records import LeaderRecord
from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode
from tests.unit.frontend.test_acls_enforced import StaticView, make_broker, run, trail


def delete_records(*wanted: tuple[str, int, int]) -> Any:
    schema = load_request_schema(21, 2)
    topic_class = codec.element(schema, "topics")
    partition_class = codec.element(topic_class, "partitions")
    topics: dict[str, list[Any]] = {}
    for topic, partition, offset in wanted:
        topics.setdefault(topic, []).append(
            codec.build(partition_class, partition_index=partition, offset=offset)
        )
    return codec.build(
        schema,
        topics=tuple(
            codec.build(topic_class, name=t, partitions=tuple(p)) for t, p in topics.items()
        ),
        timeout=datetime.timedelta(seconds=5),
    )


def answers(response: Any) -> list[tuple[str, int, ErrorCode, int]]:
    return [
        (t.name, int(p.partition_index), ErrorCode(p.error_code), int(p.low_watermark))
        for t in response.topics
        for p in t.partitions
    ]


def test_each_partition_is_checked_before_the_coordinator_moves_it() -> None:
    broker = make_broker(authorizer="none")
    view = broker.view
    assert isinstance(view, StaticView)
    leaders = dict(view.snapshot.leaders)
    leaders[("orders", 2)] = LeaderRecord(owner=4, epoch=5, lease=1, run_id="r")  # another broker
    view.snapshot = dataclasses.replace(view.snapshot, leaders=leaders)
    response = run(
        broker,
        delete_records(("orders", 0, 7), ("orders", 2, 7), ("orders", 9, 7), ("nowhere", 0, 7)),
    )
    assert answers(response) == [
        ("orders", 0, ErrorCode.none, 7),
        ("orders", 2, ErrorCode.not_leader_or_follower, -1),
        ("orders", 9, ErrorCode.unknown_topic_or_partition, -1),
        ("nowhere", 0, ErrorCode.unknown_topic_or_partition, -1),
    ]
    assert trail(broker) == [("MoveLogStart", ("orders",))]  # only the partition it leads


class FakeDirs:
    def __init__(self) -> None:
        self.asked: list[set[str] | None] = []

    def log_dir(self) -> LogDir:
        return LogDir("s3://bucket/ns", -1, -1)

    def sizes(self, topics: Iterable[str] | None) -> dict[tuple[str, int], int]:
        self.asked.append(None if topics is None else set(topics))
        return {("orders", 0): 100, ("orders", 1): 7, ("payments", 0): 5}


def describe(version: int, topics: dict[str, list[int]] | None) -> Any:
    schema = load_request_schema(35, version)
    if topics is None:
        return codec.build(schema, topics=None)
    topic_class = codec.element(schema, "topics")
    return codec.build(
        schema,
        topics=tuple(
            codec.build(topic_class, topic=t, partitions=tuple(p)) for t, p in topics.items()
        ),
    )


def described(response: Any) -> list[tuple[str, list[tuple[str, int, int]]]]:
    return [
        (
            r.log_dir,
            [
                (t.name, int(p.partition_index), int(p.partition_size))
                for t in r.topics
                for p in t.partitions
            ],
        )
        for r in response.results
    ]


def test_a_broker_describes_the_partitions_it_leads_with_their_sizes() -> None:
    dirs = FakeDirs()
    broker = dataclasses.replace(make_broker(authorizer="none"), log_dirs=dirs)
    every = run(broker, describe(4, None))
    assert described(every) == [
        (
            "s3://bucket/ns",
            [
                ("orders", 0, 100),
                ("orders", 1, 7),
                ("orders", 2, 0),
                ("payments", 0, 5),
                ("secret", 0, 0),
            ],
        )
    ]
    assert every.results[0].total_bytes == -1 and every.error_code == ErrorCode.none
    some = run(broker, describe(1, {"orders": [1, 7], "nowhere": [0]}))
    assert described(some) == [("s3://bucket/ns", [("orders", 1, 7)])]
    assert dirs.asked == [None, {"orders", "nowhere"}]
