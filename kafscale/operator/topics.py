"""A KafscaleTopic: its spec, what to do about the topic as the brokers describe it, and its
status (docs/design/operator.md, section 5). Pure: `admin` describes and carries out.

Invariants: partitions are only ever added (a spec asking for fewer is refused in the status,
``PartitionsDecreaseNotSupported``, and everything else is still done); the configs set on the
topic (Kafka's DYNAMIC_TOPIC_CONFIG source) are exactly the spec's, those removed from the spec
being deleted so the broker's default applies again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from kafscale.operator.model import SpecError

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


@dataclass(frozen=True)
class TopicSpec:
    cluster: str
    name: str
    partitions: int
    configs: dict[str, str]
    deletion_policy: Literal["Retain", "Delete"]


def parse_topic(resource: dict[str, Any]) -> TopicSpec:
    meta = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    cluster = spec.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise SpecError("spec.cluster: the KafscaleCluster's name is required")
    name = spec.get("topicName") or meta.get("name", "")
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise SpecError(f"spec.topicName: {name!r} is not a valid topic name")
    partitions = spec.get("partitions", 1)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise SpecError(f"spec.partitions: {partitions!r} must be a whole number >= 1")
    configs = spec.get("configs") or {}
    if not isinstance(configs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in configs.items()
    ):
        raise SpecError("spec.configs: a map of config names to string values")
    policy = spec.get("deletionPolicy", "Retain")
    if policy not in ("Retain", "Delete"):
        raise SpecError(f"spec.deletionPolicy: {policy!r} is not Retain or Delete")
    return TopicSpec(cluster, name, partitions, dict(configs), policy)


@dataclass(frozen=True)
class ObservedTopic:
    """The topic as described: its partition count and the configs set on it (Kafka's
    DYNAMIC_TOPIC_CONFIG source), not the defaults it inherits."""

    partitions: int
    configs: dict[str, str]


@dataclass(frozen=True)
class Plan:
    create: bool = False  # create the topic with the spec's partitions and configs
    add_partitions_to: int | None = None  # the new total
    set_configs: dict[str, str] = field(default_factory=dict)
    delete_configs: tuple[str, ...] = ()
    problem: tuple[str, str] | None = None  # (reason, message) for the status

    @property
    def empty(self) -> bool:
        return not (
            self.create or self.add_partitions_to or self.set_configs or self.delete_configs
        )


def plan(spec: TopicSpec, observed: ObservedTopic | None) -> Plan:
    """What to change so the topic matches the spec."""
    if observed is None:
        return Plan(create=True)
    problem = None
    grow = None
    if spec.partitions > observed.partitions:
        grow = spec.partitions
    elif spec.partitions < observed.partitions:
        problem = (
            "PartitionsDecreaseNotSupported",
            f"the topic has {observed.partitions} partitions, the spec {spec.partitions}: "
            "partitions can be added, never removed",
        )
    changed = {
        key: value for key, value in spec.configs.items() if observed.configs.get(key) != value
    }
    stale = tuple(sorted(key for key in observed.configs if key not in spec.configs))
    return Plan(add_partitions_to=grow, set_configs=changed, delete_configs=stale, problem=problem)


@dataclass(frozen=True)
class PartitionState:
    partition: int
    leader: int  # -1: none
    high_watermark: int  # -1: not known (ListOffsets failed for the partition)
    log_start_offset: int  # -1: not known


@dataclass(frozen=True)
class TopicStatus:
    topic_name: str
    topic_id: str
    partitions: tuple[PartitionState, ...]
    ready: bool
    reason: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The status fields besides the conditions, as the CRD names them."""
        return {
            "topicName": self.topic_name,
            "topicId": self.topic_id,
            "partitions": [
                {
                    "partition": p.partition,
                    "leader": p.leader,
                    "highWatermark": p.high_watermark,
                    "logStartOffset": p.log_start_offset,
                }
                for p in self.partitions
            ],
        }


def status(
    spec: TopicSpec,
    topic_id: str,
    partitions: tuple[PartitionState, ...],
    done: Plan,
) -> TopicStatus:
    """The status after ``done`` was carried out and the topic described again."""
    if done.problem is not None:
        reason, message = done.problem
        return TopicStatus(spec.name, topic_id, partitions, False, reason, message)
    leaderless = [p.partition for p in partitions if p.leader < 0]
    unknown = [p.partition for p in partitions if p.high_watermark < 0 or p.log_start_offset < 0]
    message = f"{len(partitions)} partitions"
    if leaderless:
        message += f"; no leader yet for partitions {leaderless[:10]}"
    if unknown:
        message += f"; offsets not known yet for partitions {unknown[:10]}"
    return TopicStatus(spec.name, topic_id, partitions, True, "Reconciled", message)
