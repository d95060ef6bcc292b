"""The coordinator's consumer-group service: the state machine (``groups``) on the coordinator's
request loop for the groups this broker coordinates, with its store, its clock, its late answers
and its metrics.

Which groups (docs/design/scale-out.md, section 7): those whose ``__consumer_offsets`` partition
(``metadata.group_partition``, Kafka's formula) this broker owns. The ownership driver
(``coordinator.owners``) says when such a partition becomes ours (``opened``, with our leader
record) and when we stop serving it (``closed``: lost, or the start of a hand-over):

- opened: the groups and offsets of the groups hashing to it are (re)loaded from the store before
  the next request or tick -- the previous coordinator may have changed them, so nothing in memory
  outlives an ownership change. Partitions opened together (a broker claims many at boot) load
  with one read of the store.
- closed: its groups are forgotten at once; members waiting in JoinGroup or SyncGroup are
  answered NOT_COORDINATOR and look the coordinator up again.
- Every write is fenced on our leader record of the group's partition (``group_store``). A fenced
  write is answered NOT_COORDINATOR and reported to the driver after the request, which closes
  the partition.

JoinGroup and SyncGroup are answered when the group is ready (the handler returns None and the
state machine replies through the server); everything else at once. Timeouts are checked every
``TICK_MS``; consumer lag is recomputed every ``LAG_MS`` from the high watermarks this process
commits (and, for partitions it has not committed since it started, from the metadata store).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from kafscale import metrics
from kafscale.coordinator.assignment import Partition
from kafscale.coordinator.consumer_groups.coordinator import ConsumerGroups
from kafscale.coordinator.consumer_groups.model import ConsumerSettings
from kafscale.coordinator.consumer_groups.target import Topics
from kafscale.coordinator.group_coordinator import GroupCoordinator
from kafscale.coordinator.group_model import Group, GroupSettings, GroupState
from kafscale.coordinator.group_store import MetadataGroupStore
from kafscale.ipc import consumer_groups, messages
from kafscale.ipc.rpc import Handler, Incoming
from kafscale.metadata import records
from kafscale.metadata.group_partition import group_partition
from kafscale.metadata.records import Keys, LeaderRecord, TopicRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.protocol import consumer_protocol
from kafscale.protocol.consumer_protocol import UndecodableProtocol, decode_subscription
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

M = TypeVar("M", bound=messages.Message)

TICK_MS = 100
LAG_MS = 5_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Ownership(Protocol):
    """What the service needs of the ownership driver (``coordinator.owners.Owners``)."""

    opened: list[Callable[[Partition, LeaderRecord], None]]
    closed: list[Callable[[Partition], None]]

    def fenced(self, topic: str, partition: int, epoch: int) -> None: ...


class Replies(Protocol):
    def reply(self, incoming: Incoming, message: messages.Message) -> None: ...


class GroupService:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        server: Replies,
        settings: GroupSettings,
        high_watermarks: dict[tuple[str, int], int],
        owners: Ownership,
        consumer_settings: ConsumerSettings | None = None,
        topics: Callable[[], Mapping[str, TopicRecord]] = dict,
        group_configs: Callable[[], Mapping[str, dict[str, str]]] = dict,
    ) -> None:
        """``topics()``, ``group_configs()``: the cluster's topics and the configs set on groups
        as this process's view has them now."""
        self.store = store
        self.keys = Keys(namespace)
        self.server = server
        self.owners = owners
        self.group_store = MetadataGroupStore(store, namespace, self._coordinating)
        self._topic_records = topics
        self._topics_seen: Mapping[str, TopicRecord] | None = None
        self._topics: Topics = {}
        self.consumer = ConsumerGroups(
            consumer_settings or ConsumerSettings(),
            self.group_store,
            self._coordinates,
            self._current_topics,
            group_configs,
        )
        self.groups = GroupCoordinator(
            settings, self.group_store, self._send, self._coordinates, self.consumer
        )
        self._consumer_rebalances = 0
        self._consumer_topics: Topics | None = None  # the topics the groups last saw
        self.high_watermarks = high_watermarks  # kept current by the partition committer
        self._next_tick = self._next_lag = 0
        self._rebalances = 0
        self._partitions = 0  # __consumer_offsets' partition count as last loaded (0: unknown)
        self._served: dict[int, LeaderRecord] = {}  # offsets partitions whose groups we serve
        self._loading: dict[int, LeaderRecord] = {}  # opened, their groups not loaded yet
        owners.opened.append(self._opened)
        owners.closed.append(self._closed)

    def handlers(self) -> dict[type, Handler]:
        return {
            kind: self._serving(handler)
            for kind, handler in {
                messages.JoinGroup: self._join,
                messages.SyncGroup: self._sync,
                messages.Heartbeat: lambda i: self.groups.heartbeat(
                    _as(i, messages.Heartbeat), now_ms()
                ),
                messages.LeaveGroup: lambda i: self.groups.leave(
                    _as(i, messages.LeaveGroup), now_ms()
                ),
                messages.OffsetCommit: self._commit,
                messages.OffsetFetch: lambda i: self.groups.fetch_offsets(
                    _as(i, messages.OffsetFetch)
                ),
                messages.DescribeGroups: lambda i: self.groups.describe(
                    _as(i, messages.DescribeGroups)
                ),
                messages.ListGroups: lambda i: self.groups.list_groups(_as(i, messages.ListGroups)),
                messages.DeleteGroups: lambda i: self.groups.delete(_as(i, messages.DeleteGroups)),
                messages.OffsetDelete: lambda i: self.groups.delete_offsets(
                    _as(i, messages.OffsetDelete), subscribed_topics
                ),
                consumer_groups.ConsumerGroupHeartbeat: self._consumer_heartbeat,
                consumer_groups.ConsumerGroupDescribe: self._consumer_describe,
            }.items()
        }

    def _serving(self, handler: Handler) -> Handler:
        """``handler`` on the groups as the store holds them now, its fences reported after."""

        def handle(incoming: Incoming) -> messages.Message | None:
            self._load()
            try:
                return handler(incoming)
            finally:
                self._report_fences()

        return handle

    def _send(self, token: Incoming, message: messages.Message) -> None:
        self.server.reply(token, message)

    def _join(self, incoming: Incoming) -> None:
        self.groups.join(incoming, _as(incoming, messages.JoinGroup), now_ms())

    def _sync(self, incoming: Incoming) -> None:
        self.groups.sync(incoming, _as(incoming, messages.SyncGroup), now_ms())

    def _consumer_heartbeat(
        self, incoming: Incoming
    ) -> consumer_groups.ConsumerGroupHeartbeatResult:
        request = _as(incoming, consumer_groups.ConsumerGroupHeartbeat)
        classic = self.groups.groups.get(request.group_id)
        live = classic if classic is not None and classic.members else None
        now = now_ms()
        result = self.consumer.heartbeat(request, live, now)
        self.groups.follow_migrations(now)
        metrics.CONSUMER_GROUP_HEARTBEATS.labels(_error_name(result.error_code)).inc()
        return result

    def _consumer_describe(self, incoming: Incoming) -> consumer_groups.ConsumerGroupsDescribed:
        request = _as(incoming, consumer_groups.ConsumerGroupDescribe)
        return consumer_groups.ConsumerGroupsDescribed(self.consumer.describe(request.group_ids))

    def _current_topics(self) -> Topics:
        """The topics as the consumer groups see them: name -> (id, partitions)."""
        seen = self._topic_records()
        if seen is not self._topics_seen:
            self._topics_seen = seen
            self._topics = {name: (t.topic_id, t.partitions) for name, t in seen.items()}
        return self._topics

    def _commit(self, incoming: Incoming) -> messages.OffsetCommitResult:
        result = self.groups.commit(_as(incoming, messages.OffsetCommit), now_ms())
        metrics.OFFSET_COMMITS.inc(sum(1 for code in result.error_codes if code == 0))
        return result

    # -- which groups are ours ---------------------------------------------------------------

    def _partition(self, group_id: str) -> int | None:
        return group_partition(group_id, self._partitions) if self._partitions else None

    def _coordinating(self, group_id: str) -> tuple[int, LeaderRecord] | None:
        """The group's offsets partition and our leader record of it, if we coordinate it."""
        partition = self._partition(group_id)
        leader = self._served.get(partition) if partition is not None else None
        return None if partition is None or leader is None else (partition, leader)

    def _coordinates(self, group_id: str) -> bool:
        return self._coordinating(group_id) is not None

    def _opened(self, partition: Partition, leader: LeaderRecord) -> None:
        topic, number = partition
        if topic == OFFSETS_TOPIC:
            self._forget_partition(number)
            self._loading[number] = leader

    def _closed(self, partition: Partition) -> None:
        topic, number = partition
        if topic == OFFSETS_TOPIC:
            self._loading.pop(number, None)
            if self._forget_partition(number):
                log.info("no longer coordinating groups", extra={"partition": number})

    def _forget_partition(self, number: int) -> bool:
        """Forget the groups of offsets partition ``number``; whether we were serving it."""
        served = self._served.pop(number, None) is not None
        self.groups.forget(
            [
                g
                for g in {*self.groups.groups, *self.consumer.groups}
                if self._partition(g) == number
            ]
        )
        return served

    def _load(self) -> None:
        """Load the groups of the partitions opened since the last call."""
        if not self._loading:
            return
        kv = self.store.get(self.keys.topic(OFFSETS_TOPIC))
        partitions = records.decode_topic(kv.value).partitions if kv is not None else 0
        if partitions != self._partitions:
            # The first load, or the topic was created again: every group may map elsewhere.
            self.groups.forget([*self.groups.groups, *self.consumer.groups])
            self._loading = {**self._served, **self._loading}
            self._served = {}
            self._partitions = partitions
        if not partitions:
            return  # the topic is gone: the driver closes its partitions
        loading = self._loading
        wanted = lambda g: group_partition(g, partitions) in loading  # noqa: E731
        loaded, offsets = self.group_store.load(wanted)
        consumer = self.group_store.load_consumer(wanted)
        self.groups.load(loaded, offsets, now_ms())
        self.consumer.load(consumer, now_ms())
        self._served.update(loading)
        self._loading = {}
        log.info(
            "coordinating groups",
            extra={
                "partitions": sorted(loading),
                "groups": len(loaded),
                "consumer_groups": len(consumer),
                "offsets": len(offsets),
            },
        )

    def _report_fences(self) -> None:
        fenced, self.group_store.fenced = self.group_store.fenced, []
        for partition, epoch in fenced:
            log.warning(
                "a group write was fenced: another broker coordinates its groups",
                extra={"partition": partition, "epoch": epoch},
            )
            self.owners.fenced(OFFSETS_TOPIC, partition, epoch)

    # -- time --------------------------------------------------------------------------------

    def tick(self) -> None:
        now = now_ms()
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_MS
        try:
            self._load()
        except MetadataStoreError as exc:  # the next tick (or request) tries again
            log.warning("cannot load groups yet", extra={"error": str(exc)})
        self.groups.tick(now)
        if self._current_topics() is not self._consumer_topics:
            self._consumer_topics = self._current_topics()
            self.consumer.topics_changed(now)
        self.consumer.tick(now)
        self.groups.follow_migrations(now)
        self._report_fences()
        self._count_groups()
        if now >= self._next_lag:
            self._next_lag = now + LAG_MS
            self._update_lag()

    def _count_groups(self) -> None:
        classic = [g for g in self.groups.groups.values() if g.group_id not in self.consumer.groups]
        states = Counter(group.state for group in classic)
        for state in GroupState:
            metrics.GROUPS.labels("classic", state.value).set(states.get(state, 0))
        for consumer_state, count in self.consumer.states().items():
            metrics.GROUPS.labels("consumer", consumer_state.value).set(count)
        metrics.GROUP_MEMBERS.labels("classic").set(sum(len(g.members) for g in classic))
        metrics.GROUP_MEMBERS.labels("consumer").set(
            sum(len(g.members) for g in self.consumer.groups.values())
        )
        metrics.REBALANCES.inc(self.groups.rebalances - self._rebalances)
        self._rebalances = self.groups.rebalances
        metrics.CONSUMER_GROUP_REBALANCES.inc(self.consumer.rebalances - self._consumer_rebalances)
        self._consumer_rebalances = self.consumer.rebalances
        fenced, self.consumer.fenced = self.consumer.fenced, []
        for reason in fenced:
            metrics.CONSUMER_GROUP_FENCED_MEMBERS.labels(reason).inc()

    def _update_lag(self) -> None:
        for group in self.groups.groups.values():
            for (topic, partition), committed in group.offsets.items():
                high_watermark = self._high_watermark(topic, partition)
                if high_watermark is not None:
                    metrics.CONSUMER_LAG.labels(group.group_id, topic, str(partition)).set(
                        max(high_watermark - committed.offset, 0)
                    )

    def _high_watermark(self, topic: str, partition: int) -> int | None:
        known = self.high_watermarks.get((topic, partition))
        if known is None:
            try:
                kv = self.store.get(self.keys.partition(topic, partition))
            except Exception as exc:  # lag is best effort; the next round tries again
                log.warning("cannot read a high watermark", extra={"error": str(exc)})
                return None
            known = records.decode_partition(kv.value).high_watermark if kv else 0
            self.high_watermarks[(topic, partition)] = known
        return known


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _as(incoming: Incoming, kind: type[M]) -> M:
    assert isinstance(incoming.message, kind)
    return incoming.message


def subscribed_topics(group: Group) -> set[str]:
    """The topics a classic consumer group's members subscribe to (their
    ConsumerProtocolSubscription for the group's protocol)."""
    topics: set[str] = set()
    if group.protocol_type != consumer_protocol.PROTOCOL_TYPE or group.protocol is None:
        return topics
    for member in group.members.values():
        try:
            topics.update(decode_subscription(member.metadata(group.protocol)).topics)
        except (UndecodableProtocol, StopIteration):
            log.warning("undecodable subscription", extra={"member": member.member_id})
    return topics
