"""What the metadata store keeps of KIP-848 consumer groups, and under which keys
(docs/design/ecosystem.md, section 5.7).

    /kafscale/{ns}/cgroups/{group}/group               ConsumerGroupRecord: the group's epochs;
                                                       the group exists iff this key does
    /kafscale/{ns}/cgroups/{group}/members/{member}    ConsumerMemberRecord: one member, its
                                                       subscription, current and target assignment

Group and member ids are percent-encoded as group ids are in ``records``. Partitions are named by
topic id (canonical UUID text), so a topic deleted and created again is another topic. Committed
offsets stay where every group's are (``records.Keys.offset``).

A target assignment larger than one transaction is written member by member and the group record
last: a member whose ``target_epoch`` is above the group's ``assignment_epoch`` was written by a
coordinator fenced before it finished, and the loader recomputes the target.
"""

from __future__ import annotations

import urllib.parse

import msgspec

# topic id -> partition numbers, sorted
StoredPartitions = dict[str, list[int]]


class ConsumerGroupRecord(msgspec.Struct, frozen=True):
    group_id: str
    epoch: int
    assignment_epoch: int
    # A digest of the subscribed topics' ids, names and partition counts: a change bumps the epoch.
    metadata_hash: str = ""


class ConsumerMemberRecord(msgspec.Struct, frozen=True):
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    state: str
    member_epoch: int
    previous_member_epoch: int
    assigned: StoredPartitions
    pending_revocation: StoredPartitions
    target: StoredPartitions
    target_epoch: int
    # A member of the classic protocol inside the consumer group (KIP-848's online migration):
    # its JoinGroup's session timeout and protocols (name, metadata); None for the others.
    classic_session_timeout_ms: int | None = None
    classic_protocols: list[tuple[str, bytes]] | None = None


class ConsumerGroupKeys:
    """Key names of the consumer groups of one namespace root (``records.Keys.root``)."""

    def __init__(self, root: str) -> None:
        self.prefix = root + "cgroups/"

    def group_prefix(self, group_id: str) -> str:
        """Every key of the group."""
        return f"{self.prefix}{_escape(group_id)}/"

    def group(self, group_id: str) -> str:
        return self.group_prefix(group_id) + "group"

    def member(self, group_id: str, member_id: str) -> str:
        return f"{self.group_prefix(group_id)}members/{_escape(member_id)}"

    def parse(self, key: str) -> tuple[str, str | None] | None:
        """(group id, member id or None for the group record) of a key, or None."""
        parts = key[len(self.prefix) :].split("/")
        if not key.startswith(self.prefix):
            return None
        if len(parts) == 2 and parts[1] == "group":
            return urllib.parse.unquote(parts[0]), None
        if len(parts) == 3 and parts[1] == "members" and parts[2]:
            return urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[2])
        return None


def _escape(name: str) -> str:
    return urllib.parse.quote(name, safe="")


encode = msgspec.json.encode


def decode_group(data: bytes) -> ConsumerGroupRecord:
    return msgspec.json.decode(data, type=ConsumerGroupRecord)


def decode_member(data: bytes) -> ConsumerMemberRecord:
    return msgspec.json.decode(data, type=ConsumerMemberRecord)
