"""Group configs (kafscale.metadata.group_configs): Kafka 4.3's seventeen, validated with Kafka's
messages, and the consumer groups' session timeout and heartbeat interval taken from them."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from kafscale.coordinator.consumer_groups.coordinator import ConsumerGroups
from kafscale.coordinator.consumer_groups.model import ConsumerSettings
from kafscale.metadata import group_configs
from kafscale.metadata.group_configs import apply

SET, DELETE, APPEND = 0, 1, 2


class Change(NamedTuple):
    name: str
    operation: int
    value: str | None


def test_kafkas_seventeen_group_configs_are_known() -> None:
    assert len(group_configs.CONFIGS) == 17
    effective = {name for name, c in group_configs.CONFIGS.items() if c.effective}
    assert effective == {"consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"}


def test_set_delete_and_replace() -> None:
    configs, problem = apply({}, [Change("consumer.session.timeout.ms", SET, "6000")], True)
    assert (configs, problem) == ({"consumer.session.timeout.ms": "6000"}, None)
    configs, _ = apply(configs, [Change("share.isolation.level", SET, "read_committed")], True)
    assert len(configs) == 2
    configs, _ = apply(configs, [Change("consumer.session.timeout.ms", DELETE, None)], True)
    assert configs == {"share.isolation.level": "read_committed"}
    replaced, _ = apply(configs, [Change("streams.num.standby.replicas", SET, "1")], False)
    assert replaced == {"streams.num.standby.replicas": "1"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (Change("no.such", SET, "1"), "Unknown group config name: no.such"),
        (
            Change("share.delivery.count.limit", SET, "11"),
            "share.delivery.count.limit must be in the range 2 to 10 inclusive.",
        ),
        (Change("consumer.session.timeout.ms", SET, "soon"), "Not a number of type INT"),
        (Change("share.auto.offset.reset", SET, "middle"), "String must be one of"),
        (Change("consumer.session.timeout.ms", APPEND, "1"), "is not a list config"),
        (
            Change("consumer.session.timeout.ms", SET, "5000"),  # the heartbeat's default: 5000
            "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms",
        ),
    ],
)
def test_invalid_changes_are_refused_whole(change: Change, message: str) -> None:
    before = {"consumer.heartbeat.interval.ms": "1000"} if "heartbeat" not in message else {}
    configs, problem = apply(before, [Change("share.delivery.count.limit", SET, "3"), change], True)
    assert problem is not None and message in problem
    assert configs == before


def test_a_groups_configs_replace_the_brokers_settings_for_that_group_only() -> None:
    configs = {
        "g": {"consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "500"}
    }
    groups = ConsumerGroups(
        ConsumerSettings(),
        None,
        lambda _: True,
        lambda: {},
        lambda: configs,  # type: ignore[arg-type]
    )
    assert (
        groups.settings_of("g").session_timeout_ms,
        groups.settings_of("g").heartbeat_interval_ms,
    ) == (6000, 500)
    assert groups.settings_of("other") == ConsumerSettings()
