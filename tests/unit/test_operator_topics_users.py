"""KafscaleTopic and KafscaleUser specs and plans (kafscale/operator/topics.py, users.py): what the
operator does about a topic or a user as the brokers describe it. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from kafscale.operator import topics, users
from kafscale.operator.model import SpecError


def topic(**spec: Any) -> topics.TopicSpec:
    return topics.parse_topic({"metadata": {"name": "orders"}, "spec": {"cluster": "c", **spec}})


def test_topic_defaults() -> None:
    spec = topic()
    assert (spec.name, spec.partitions, spec.configs, spec.deletion_policy) == (
        "orders",
        1,
        {},
        "Retain",
    )
    assert topic(topicName="orders.v2").name == "orders.v2"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cluster": ""}, "spec.cluster"),
        ({"topicName": "bad name"}, "spec.topicName"),
        ({"topicName": ".."}, "spec.topicName"),
        ({"partitions": 0}, "spec.partitions"),
        ({"partitions": True}, "spec.partitions"),
        ({"configs": {"retention.ms": 5}}, "spec.configs"),
        ({"deletionPolicy": "Orphan"}, "spec.deletionPolicy"),
    ],
)
def test_bad_topic_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{field}"):
        topics.parse_topic({"metadata": {"name": "t"}, "spec": {"cluster": "c", **spec}})


def test_a_missing_topic_is_created() -> None:
    assert topics.plan(topic(partitions=3), None) == topics.Plan(create=True)


def test_an_unchanged_topic_needs_nothing() -> None:
    todo = topics.plan(
        topic(partitions=3, configs={"retention.ms": "1"}),
        topics.ObservedTopic(3, {"retention.ms": "1"}),
    )
    assert todo.empty and todo.problem is None


def test_partitions_grow_and_configs_are_set_and_removed() -> None:
    todo = topics.plan(
        topic(partitions=6, configs={"retention.ms": "2", "cleanup.policy": "delete"}),
        topics.ObservedTopic(3, {"retention.ms": "1", "max.message.bytes": "100"}),
    )
    assert todo.add_partitions_to == 6
    assert todo.set_configs == {"retention.ms": "2", "cleanup.policy": "delete"}
    assert todo.delete_configs == ("max.message.bytes",)
    assert not todo.create


def test_fewer_partitions_is_a_problem_but_configs_still_apply() -> None:
    todo = topics.plan(
        topic(partitions=2, configs={"retention.ms": "9"}), topics.ObservedTopic(4, {})
    )
    assert todo.add_partitions_to is None
    assert todo.problem is not None and todo.problem[0] == "PartitionsDecreaseNotSupported"
    assert todo.set_configs == {"retention.ms": "9"}
    states = (topics.PartitionState(0, 1, 5, 0),)
    result = topics.status(topic(partitions=2), "id", states, todo)
    assert (result.ready, result.reason) == (False, "PartitionsDecreaseNotSupported")


def test_topic_status_shape() -> None:
    states = (topics.PartitionState(0, 1, 10, 2), topics.PartitionState(1, -1, 0, 0))
    result = topics.status(topic(partitions=2), "abc", states, topics.Plan())
    assert result.ready and result.reason == "Reconciled"
    assert "no leader yet for partitions [1]" in result.message
    assert result.to_dict() == {
        "topicName": "orders",
        "topicId": "abc",
        "partitions": [
            {"partition": 0, "leader": 1, "highWatermark": 10, "logStartOffset": 2},
            {"partition": 1, "leader": -1, "highWatermark": 0, "logStartOffset": 0},
        ],
    }


# --- users ---------------------------------------------------------------------------------


def user(**spec: Any) -> users.UserSpec:
    return users.parse_user({"metadata": {"name": "app"}, "spec": {"cluster": "c", **spec}})


READ_ORDERS = {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read", "Describe"]}


def test_user_defaults_and_acls_in_kafkas_names() -> None:
    spec = user(
        authorization={
            "acls": [
                READ_ORDERS,
                {
                    "resource": {"type": "group", "name": "app-", "patternType": "prefix"},
                    "operations": ["Read"],
                    "type": "deny",
                    "host": "10.0.0.1",
                },
                {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
            ]
        }
    )
    assert (spec.name, spec.mechanism, spec.iterations, spec.password_secret) == (
        "app",
        "SCRAM-SHA-512",
        4096,
        None,
    )
    assert spec.principal == "User:app"
    assert spec.acls == {
        ("TOPIC", "orders", "LITERAL", "READ", "*", "ALLOW"),
        ("TOPIC", "orders", "LITERAL", "DESCRIBE", "*", "ALLOW"),
        ("GROUP", "app-", "PREFIXED", "READ", "10.0.0.1", "DENY"),
        ("BROKER", "kafka-cluster", "LITERAL", "IDEMPOTENT_WRITE", "*", "ALLOW"),
    }
    ref = user(authentication={"type": "scram-sha-256", "passwordSecret": {"name": "s"}})
    assert ref.mechanism == "SCRAM-SHA-256"
    assert ref.password_secret == users.SecretRef("s", "password")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"userName": "a b"}, "spec.userName"),
        ({"authentication": {"type": "plain"}}, "spec.authentication.type"),
        ({"authentication": {"iterations": 100}}, "spec.authentication.iterations"),
        ({"authentication": {"passwordSecret": {}}}, "spec.authentication.passwordSecret"),
        (
            {"authorization": {"acls": [{"resource": {"type": "topic"}, "operations": ["Read"]}]}},
            r"spec.authorization.acls\[0\].resource.name",
        ),
        (
            {
                "authorization": {
                    "acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}]
                }
            },
            r"spec.authorization.acls\[0\].operations",
        ),
    ],
)
def test_bad_user_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=f"^{field}"):
        user(**spec)


def test_a_new_user_gets_its_credential_and_acls() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    todo = users.plan(spec, "pw", "", set(), set())
    assert todo.upsert
    assert set(todo.create_acls) == spec.acls and todo.delete_acls == ()
    assert todo.digest == users.credential_digest("app", "SCRAM-SHA-512", 4096, "pw")


def test_nothing_to_do_when_digest_mechanism_and_acls_match() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    digest = users.credential_digest("app", "SCRAM-SHA-512", 4096, "pw")
    todo = users.plan(spec, "pw", digest, {"SCRAM-SHA-512"}, set(spec.acls))
    assert not todo.upsert and not todo.create_acls and not todo.delete_acls
    assert todo.delete_mechanisms == ()


def test_a_changed_password_or_a_lost_credential_is_stored_again() -> None:
    spec = user()
    digest = users.credential_digest("app", "SCRAM-SHA-512", 4096, "old")
    assert users.plan(spec, "new", digest, {"SCRAM-SHA-512"}, set()).upsert
    # Same password, but the credential was deleted behind the operator's back.
    assert users.plan(spec, "old", digest, set(), set()).upsert


def test_a_mechanism_switch_deletes_the_other_credential() -> None:
    spec = user(authentication={"type": "scram-sha-256"})
    todo = users.plan(spec, "pw", "", {"SCRAM-SHA-512"}, set())
    assert todo.upsert and todo.delete_mechanisms == ("SCRAM-SHA-512",)


def test_acls_are_made_to_match() -> None:
    spec = user(authorization={"acls": [READ_ORDERS]})
    extra = ("TOPIC", "payments", "LITERAL", "WRITE", "*", "ALLOW")
    kept = ("TOPIC", "orders", "LITERAL", "READ", "*", "ALLOW")
    todo = users.plan(spec, "pw", "", {"SCRAM-SHA-512"}, {extra, kept})
    assert todo.create_acls == (("TOPIC", "orders", "LITERAL", "DESCRIBE", "*", "ALLOW"),)
    assert todo.delete_acls == (extra,)


def test_the_digest_tells_changes_apart_and_never_holds_the_password() -> None:
    base = users.credential_digest("app", "SCRAM-SHA-512", 4096, "hunter2-secret")
    assert "hunter2" not in base
    others = {
        users.credential_digest("app2", "SCRAM-SHA-512", 4096, "hunter2-secret"),
        users.credential_digest("app", "SCRAM-SHA-256", 4096, "hunter2-secret"),
        users.credential_digest("app", "SCRAM-SHA-512", 8192, "hunter2-secret"),
        users.credential_digest("app", "SCRAM-SHA-512", 4096, "hunter3-secret"),
    }
    assert base not in others and len(others) == 4
