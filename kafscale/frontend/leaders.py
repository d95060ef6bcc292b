"""Who leads each partition, as the watched view says, and what clients are told about it.

Every broker answers from the same leader keys (``leaders/{topic}/{p}``: ``Snapshot.leaders``), so
they agree: a partition is led by its key's owner at the key's leader epoch. A partition without a
key (nobody has claimed it yet, or its owner's lease is gone), or whose owner is not a registered
broker, has no leader: it is offline. This broker counts as registered even before its own
registration is seen (``live_brokers``). Every broker is described at its endpoint on the listener
the request came in on.

Produce, Fetch, ListOffsets and OffsetForLeaderEpoch for a partition this broker does not lead are
refused here, per partition and before anything reaches a shard (the shard refuses them too, and
decides: docs/design/scale-out.md, section 6). ``check`` follows Kafka's ``Partition.getLocalLog``:
the request's ``current_leader_epoch`` first (negative: no check; older than the key's epoch is
FENCED_LEADER_EPOCH, newer is UNKNOWN_LEADER_EPOCH, an epoch this broker has not seen yet), then
leadership (NOT_LEADER_OR_FOLLOWER). All three are retriable: the client refreshes its metadata.

KIP-951: such a refusal also names the partition's current leader (``current_leader``) and the
response lists the endpoints of the leaders it names (``node_endpoints``), so a client moves to
the new leader without waiting for a metadata round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from kafscale.config import Config
from kafscale.frontend.context import RequestContext
from kafscale.metadata.records import BrokerRecord
from kafscale.metadata.view import Snapshot
from kafscale.protocol.codec import build
from kafscale.protocol.errors import ErrorCode

NO_LEADER = -1  # Kafka's MetadataResponse.NO_LEADER_ID
NO_EPOCH = -1  # RecordBatch.NO_PARTITION_LEADER_EPOCH; in a request: no epoch check


@dataclass(frozen=True, slots=True)
class Leader:
    """A partition's leader and leader epoch; ``NO_LEADER`` when offline, ``NO_EPOCH`` when no
    leader key exists at all."""

    node_id: int = NO_LEADER
    epoch: int = NO_EPOCH

    @property
    def online(self) -> bool:
        return self.node_id != NO_LEADER


def live_brokers(ctx: RequestContext, registered: dict[int, BrokerRecord]) -> list[BrokerRecord]:
    """Registered brokers, by node id, with the host and port of the listener the request came
    in on (a broker without that listener is left out, as Kafka does); this one always included,
    even before its registration is seen (draining brokers too: connections they still hold
    must resolve)."""
    listener = ctx.session.listener
    brokers = dict(registered)
    brokers.setdefault(ctx.broker.node_id, own_record(ctx.broker.config, ctx.broker.node_id))
    out = []
    for node_id in sorted(brokers):
        record = brokers[node_id]
        endpoint = record.endpoint(listener)
        if endpoint is not None:
            out.append(msgspec.structs.replace(record, host=endpoint[0], port=endpoint[1]))
    return out


def own_record(config: Config, node_id: int) -> BrokerRecord:
    """This broker's registration as its configuration describes it."""
    primary = config.primary_listener
    return BrokerRecord(
        node_id=node_id,
        host=primary.advertised_host,
        port=primary.advertised_port,
        listeners={x.name: (x.advertised_host, x.advertised_port) for x in config.kafka_listeners},
    )


class Leaders:
    """The leaders of one request's partitions, all from one snapshot of the view. Remembers the
    endpoints of the leaders its refusals name (KIP-951's NodeEndpoints)."""

    def __init__(self, ctx: RequestContext, snapshot: Snapshot | None = None) -> None:
        snapshot = snapshot if snapshot is not None else ctx.broker.view.snapshot
        self.node_id = ctx.broker.node_id
        self.brokers = {b.node_id: b for b in live_brokers(ctx, snapshot.brokers)}
        self._keys = snapshot.leaders
        self._named: dict[int, BrokerRecord] = {}

    def of(self, topic: str, partition: int) -> Leader:
        record = self._keys.get((topic, partition))
        if record is None:
            return Leader()
        if record.owner not in self.brokers:
            return Leader(NO_LEADER, record.epoch)  # its registration (and lease) is gone
        return Leader(record.owner, record.epoch)

    def check(self, topic: str, partition: int, current_epoch: int = NO_EPOCH) -> ErrorCode | None:
        """None when this broker leads the partition at the epoch the client knows (if any)."""
        leader = self.of(topic, partition)
        if current_epoch >= 0 and leader.epoch != NO_EPOCH:
            if current_epoch < leader.epoch:
                return ErrorCode.fenced_leader_epoch
            if current_epoch > leader.epoch:
                return ErrorCode.unknown_leader_epoch
        if leader.node_id != self.node_id:
            return ErrorCode.not_leader_or_follower
        return None

    def current_leader(self, topic: str, partition: int) -> Leader:
        """The leader a refusal names (KIP-951); its endpoint joins ``node_endpoints``."""
        leader = self.of(topic, partition)
        if leader.online:
            self._named[leader.node_id] = self.brokers[leader.node_id]
        return leader

    def node_endpoints(self) -> list[BrokerRecord]:
        """The endpoints of every leader ``current_leader`` named, by node id."""
        return [self._named[node_id] for node_id in sorted(self._named)]


def leader_id_and_epoch(cls: type[Any], leader: Leader) -> Any:
    """A kio ``LeaderIdAndEpoch`` (Produce v10+ ``CurrentLeader``)."""
    return build(cls, leader_id=leader.node_id, leader_epoch=leader.epoch)


def node_endpoint(cls: type[Any], record: BrokerRecord) -> Any:
    """A kio ``NodeEndpoint`` (Produce v10+, Fetch v16+ ``NodeEndpoints``)."""
    return build(cls, node_id=record.node_id, host=record.host, port=record.port, rack=record.rack)
