"""The KIP-848 consumer groups' messages (docs/design/ecosystem.md, section 5.7).

  frontend -> coordinator   ConsumerGroupHeartbeat -> ConsumerGroupHeartbeatResult
  frontend -> coordinator   ConsumerGroupDescribe -> ConsumerGroupsDescribed
  frontend -> coordinator   AlterGroupConfigs -> GroupConfigResults (any broker's coordinator)

Topics are named by id (canonical UUID text) as on the wire; the frontend names them for
ConsumerGroupDescribe from its own view.
"""

from __future__ import annotations

import msgspec

from kafscale.ipc.base import Message


class TopicIdPartitions(msgspec.Struct, frozen=True):
    topic_id: str
    partitions: list[int]


class ConsumerGroupHeartbeat(Message, frozen=True):
    """Fields the client leaves null (or -1) when unchanged since its last heartbeat are None
    (or -1) here too."""

    version: int
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    topic_partitions: list[TopicIdPartitions] | None
    client_id: str = ""
    client_host: str = ""


class ConsumerGroupHeartbeatResult(Message, frozen=True):
    error_code: int
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: list[TopicIdPartitions] | None = None  # None: unchanged


class ConsumerGroupDescribe(Message, frozen=True):
    group_ids: list[str]


class ConsumerMemberDescription(msgspec.Struct, frozen=True):
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[TopicIdPartitions]
    target_assignment: list[TopicIdPartitions]
    classic: bool = False  # a classic-protocol member (online migration)


class ConsumerGroupDescription(msgspec.Struct, frozen=True):
    group_id: str
    error_code: int
    error_message: str | None = None
    state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: list[ConsumerMemberDescription] = msgspec.field(default_factory=list)


class ConsumerGroupsDescribed(Message, frozen=True):
    groups: list[ConsumerGroupDescription]


class GroupConfigChange(msgspec.Struct, frozen=True):
    name: str
    operation: int  # IncrementalAlterConfigs': 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT
    value: str | None


class GroupConfigChanges(msgspec.Struct, frozen=True):
    group_id: str
    changes: list[GroupConfigChange]


class AlterGroupConfigs(Message, frozen=True):
    groups: list[GroupConfigChanges]
    incremental: bool = True  # False: legacy AlterConfigs, the configs given replace them all
    validate_only: bool = False


class GroupConfigResult(msgspec.Struct, frozen=True):
    group_id: str
    error_code: int
    error_message: str | None = None


class GroupConfigResults(Message, frozen=True):
    """``revision``: the metadata revision holding the writes (0: none), for ``caught_up``."""

    results: list[GroupConfigResult]
    revision: int
