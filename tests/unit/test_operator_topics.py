"""A KafscaleTopic's spec, plan and status (kafscale/operator/topics.py): what the operator does
about a topic as the brokers describe it. Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kafscale.operator import topics
from kafscale.operator.model import SpecError

CRD = Path(__file__).parents[2] / "charts/kafscale/crds/kafscaletopics.yaml"


def topic(**spec: Any) -> topics.TopicSpec:
    return topics.parse_topic({"metadata": {"name": "orders"}, "spec": {"cluster": "c", **spec}})


def observed(partitions: int, **configs: str) -> topics.ObservedTopic:
    return topics.ObservedTopic(partitions, dict(configs))


# --- the spec ------------------------------------------------------------------------------


def test_defaults_name_from_metadata_one_partition_no_configs_retained() -> None:
    assert topic() == topics.TopicSpec("c", "orders", 1, {}, "Retain")


def test_every_field_given() -> None:
    spec = topic(
        topicName="orders.v2_x-y",
        partitions=12,
        configs={"retention.ms": "60000", "cleanup.policy": "compact"},
        deletionPolicy="Delete",
    )
    assert spec == topics.TopicSpec(
        "c",
        "orders.v2_x-y",
        12,
        {"retention.ms": "60000", "cleanup.policy": "compact"},
        "Delete",
    )


def test_the_spec_is_copied_not_shared() -> None:
    configs = {"retention.ms": "1"}
    spec = topics.parse_topic(
        {"metadata": {"name": "t"}, "spec": {"cluster": "c", "configs": configs}}
    )
    configs["retention.ms"] = "2"
    assert spec.configs == {"retention.ms": "1"}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cluster": ""}, "spec.cluster"),
        ({"cluster": None}, "spec.cluster"),
        ({"topicName": "bad name"}, "spec.topicName"),
        ({"topicName": "orders\n"}, "spec.topicName"),
        ({"topicName": "x" * 250}, "spec.topicName"),
        ({"topicName": "."}, "spec.topicName"),
        ({"topicName": ".."}, "spec.topicName"),
        ({"partitions": 0}, "spec.partitions"),
        ({"partitions": -3}, "spec.partitions"),
        ({"partitions": "3"}, "spec.partitions"),
        ({"partitions": True}, "spec.partitions"),
        ({"partitions": 2.5}, "spec.partitions"),
        ({"configs": {"retention.ms": 5}}, "spec.configs"),
        ({"configs": ["retention.ms=5"]}, "spec.configs"),
        ({"deletionPolicy": "Orphan"}, "spec.deletionPolicy"),
    ],
)
def test_a_bad_spec_names_its_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{field}:"):
        topics.parse_topic({"metadata": {"name": "t"}, "spec": {"cluster": "c", **spec}})


def test_a_missing_spec_names_the_cluster() -> None:
    with pytest.raises(SpecError, match=r"^spec\.cluster:"):
        topics.parse_topic({"metadata": {"name": "t"}})


def test_the_longest_name_kafka_allows() -> None:
    assert topic(topicName="x" * 249).name == "x" * 249


# --- the plan ------------------------------------------------------------------------------


def test_a_missing_topic_is_created_with_the_specs_partitions_and_configs() -> None:
    todo = topics.plan(topic(partitions=3, configs={"retention.ms": "1"}), None)
    assert todo == topics.Plan(create=True)
    assert not todo.empty and todo.problem is None


def test_a_topic_as_the_spec_says_needs_nothing() -> None:
    spec = topic(partitions=3, configs={"retention.ms": "1"})
    todo = topics.plan(spec, observed(3, **{"retention.ms": "1"}))
    assert todo == topics.Plan()
    assert todo.empty


def test_more_partitions_are_added_up_to_the_specs_count() -> None:
    todo = topics.plan(topic(partitions=6), observed(3))
    assert todo == topics.Plan(add_partitions_to=6)


def test_a_new_config_is_set() -> None:
    todo = topics.plan(topic(configs={"retention.ms": "5"}), observed(1))
    assert todo == topics.Plan(set_configs={"retention.ms": "5"})


def test_a_changed_config_is_set_and_an_unchanged_one_left_alone() -> None:
    spec = topic(configs={"retention.ms": "5", "cleanup.policy": "compact"})
    todo = topics.plan(spec, observed(1, **{"retention.ms": "4", "cleanup.policy": "compact"}))
    assert todo == topics.Plan(set_configs={"retention.ms": "5"})


def test_a_config_no_longer_in_the_spec_is_deleted() -> None:
    todo = topics.plan(
        topic(configs={"retention.ms": "5"}),
        observed(1, **{"retention.ms": "5", "max.message.bytes": "100", "cleanup.policy": "x"}),
    )
    assert todo == topics.Plan(delete_configs=("cleanup.policy", "max.message.bytes"))


def test_all_at_once() -> None:
    todo = topics.plan(
        topic(partitions=6, configs={"retention.ms": "2", "cleanup.policy": "delete"}),
        observed(3, **{"retention.ms": "1", "max.message.bytes": "100"}),
    )
    assert todo == topics.Plan(
        add_partitions_to=6,
        set_configs={"retention.ms": "2", "cleanup.policy": "delete"},
        delete_configs=("max.message.bytes",),
    )


def test_fewer_partitions_are_refused_and_nothing_else_is_blocked() -> None:
    todo = topics.plan(
        topic(partitions=2, configs={"retention.ms": "9"}),
        observed(4, **{"cleanup.policy": "compact"}),
    )
    assert todo.add_partitions_to is None
    assert todo.set_configs == {"retention.ms": "9"}
    assert todo.delete_configs == ("cleanup.policy",)
    assert todo.problem is not None
    reason, message = todo.problem
    assert reason == "PartitionsDecreaseNotSupported"
    assert "4 partitions" in message and "the spec 2" in message


def test_fewer_partitions_alone_is_still_a_problem_with_nothing_to_do() -> None:
    todo = topics.plan(topic(partitions=1), observed(2))
    assert todo.empty
    assert todo.problem is not None and todo.problem[0] == "PartitionsDecreaseNotSupported"


# --- the status ----------------------------------------------------------------------------


def states(*rows: tuple[int, int, int, int]) -> tuple[topics.PartitionState, ...]:
    return tuple(topics.PartitionState(*row) for row in rows)


def test_the_status_in_the_crds_shape() -> None:
    result = topics.status(
        topic(partitions=2),
        "AAAAAAAAAAAAAAAAAAAAAA",
        states((0, 1, 10, 2), (1, 0, 7, 0)),
        topics.Plan(),
    )
    assert (result.ready, result.reason, result.message) == (True, "Reconciled", "2 partitions")
    assert result.to_dict() == {
        "topicName": "orders",
        "topicId": "AAAAAAAAAAAAAAAAAAAAAA",
        "partitions": [
            {"partition": 0, "leader": 1, "highWatermark": 10, "logStartOffset": 2},
            {"partition": 1, "leader": 0, "highWatermark": 7, "logStartOffset": 0},
        ],
    }


def test_status_keys_are_the_crds() -> None:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    result = topics.status(topic(), "id", states((0, 0, 0, 0)), topics.Plan())
    shape = result.to_dict()
    assert set(shape) <= set(schema["properties"])
    item = schema["properties"]["partitions"]["items"]["properties"]
    assert set(shape["partitions"][0]) == set(item)


def test_partitions_without_a_leader_or_offsets_are_said() -> None:
    result = topics.status(
        topic(partitions=3),
        "id",
        states((0, -1, -1, -1), (1, 2, 5, 0), (2, 2, -1, -1)),
        topics.Plan(),
    )
    assert result.ready and result.reason == "Reconciled"
    assert "no leader yet for partitions [0]" in result.message
    assert "offsets not known yet for partitions [0, 2]" in result.message


def test_a_problem_makes_the_status_not_ready() -> None:
    todo = topics.plan(topic(partitions=1), observed(2))
    result = topics.status(topic(partitions=1), "id", states((0, 0, 1, 0), (1, 0, 1, 0)), todo)
    assert (result.ready, result.reason) == (False, "PartitionsDecreaseNotSupported")
    assert todo.problem is not None and result.message == todo.problem[1]
    assert len(result.to_dict()["partitions"]) == 2  # what the topic has, not the spec
