"""FindCoordinator answers the owner of the group's __consumer_offsets partition, from the view."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from kafscale.ipc.messages import TopicResult, TopicSpec
from kafscale.metadata.group_partition import group_partition
from kafscale.metadata.records import LeaderRecord
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol.errors import ErrorCode
from tests.unit.frontend.test_requests import (
    FakeCoordinator,
    decode_response,
    find_coordinator,
    make_broker,
    process,
)
from tests.unit.protocol.test_codec import request_frame

PARTITIONS = 5  # FakeCoordinator's __consumer_offsets


def lookup(broker: Any, version: int, *groups: str, key_type: int = 0) -> list[Any]:
    """(error, node, host, port) per key, whatever the version's layout."""
    frame = process(broker, request_frame(find_coordinator(version, *groups, key_type=key_type)))
    assert frame is not None
    body = decode_response(frame, 10, version)[1]
    entries = body.coordinators if version >= 4 else [body]
    return [(e.error_code, e.node_id, e.host, e.port) for e in entries]


def owned_by(broker: Any, group: str, owner: int) -> None:
    """Give the group's offsets partition a leader key naming ``owner``."""
    snapshot = broker.view.snapshot
    if OFFSETS_TOPIC not in snapshot.topics:
        lookup(broker, 4, "creating")  # the first lookup creates the topic
    partition = group_partition(group, snapshot.topics[OFFSETS_TOPIC].partitions)
    snapshot.leaders[(OFFSETS_TOPIC, partition)] = LeaderRecord(owner, 1, 7, "run")


@pytest.mark.parametrize("version", [0, 1, 3, 4, 6])
def test_the_owner_of_the_groups_offsets_partition_coordinates_it(version: int) -> None:
    broker = make_broker()
    owned_by(broker, "orders-app", 4)
    assert lookup(broker, version, "orders-app") == [(ErrorCode.none, 4, "10.0.0.4", 9092)]


def test_each_key_of_a_batch_gets_its_own_coordinator() -> None:
    broker = make_broker()
    by_partition = {group_partition(g, PARTITIONS): g for g in (f"group-{i}" for i in range(50))}
    assert len(by_partition) >= 2
    first, second = list(by_partition.values())[:2]
    owned_by(broker, first, 4)
    owned_by(broker, second, 3)
    assert lookup(broker, 4, first, second, "") == [
        (ErrorCode.none, 4, "10.0.0.4", 9092),
        (ErrorCode.none, 3, "127.0.0.1", 19092),
        (ErrorCode.invalid_request, -1, "", -1),
    ]


def test_this_broker_is_answered_before_its_registration_is_seen() -> None:
    broker = make_broker()
    del broker.view.snapshot.brokers[3]
    owned_by(broker, "g", 3)
    assert lookup(broker, 3, "g") == [(ErrorCode.none, 3, "127.0.0.1", 19092)]


@pytest.mark.parametrize("version", [0, 4])
def test_a_partition_without_an_owner_is_coordinator_not_available(version: int) -> None:
    broker = make_broker()
    lookup(broker, version, "g")  # creates the topic, no leader keys yet
    assert OFFSETS_TOPIC in broker.view.snapshot.topics
    assert lookup(broker, version, "g") == [(ErrorCode.coordinator_not_available, -1, "", -1)]
    owned_by(broker, "g", 9)  # a leader key naming a broker not registered (left meanwhile)
    assert lookup(broker, version, "g") == [(ErrorCode.coordinator_not_available, -1, "", -1)]


class CreatesNothing(FakeCoordinator):
    """A coordinator that is restarting: the topic is not created yet."""

    async def create_topics(
        self, specs: Sequence[TopicSpec], validate_only: bool = False
    ) -> list[TopicResult]:
        self.created += [spec.name for spec in specs]
        return []


def test_without_the_offsets_topic_the_coordinator_is_not_available() -> None:
    plain = make_broker()
    coordinator = CreatesNothing(plain.view)
    broker = dataclasses.replace(plain, coordinator=coordinator)
    assert lookup(broker, 4, "g") == [(ErrorCode.coordinator_not_available, -1, "", -1)]
    assert coordinator.created == [OFFSETS_TOPIC]  # it was asked for


def test_transaction_coordinators_are_still_refused() -> None:
    broker = make_broker()
    owned_by(broker, "txn", 3)
    assert lookup(broker, 4, "txn", key_type=1) == [(ErrorCode.invalid_request, -1, "", -1)]
