"""The consumer (KIP-848) groups this broker coordinates: the pure steps of ``machine`` run on them,
each step stored before it is kept or answered. Which groups are ours, loading and forgetting them
is the group service's, as for classic groups (``coordinator.group_service``).

A group id is one type at a time. A consumer group takes over a classic group id with no members
(its committed offsets carry over); a classic JoinGroup takes over an empty consumer group. A
live classic group is upgraded by its first consumer-protocol member when the migration policy
allows (``migration.upgrade``, stored with the classic record emptied in the same write; the
classic side then drops its members: ``upgraded``), classic members live on inside consumer
groups (``classic_join``, ``classic_sync``, ``classic_heartbeat``, ``classic_leave``), and a
group left with classic members only becomes classic again (``downgraded``, for the classic side
to adopt).

Offsets of consumer groups are kept with every group's (``group_offsets``); what differs is who
may commit and fetch them (``commit_error``, ``fetch_error``, Kafka's ``ConsumerGroup``
``validateOffsetCommit``/``validateOffsetFetch``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping

from kafscale.coordinator.consumer_groups import machine, migration
from kafscale.coordinator.consumer_groups.machine import Step
from kafscale.coordinator.consumer_groups.model import (
    ConsumerGroup,
    ConsumerSettings,
    GroupState,
    Partitions,
)
from kafscale.coordinator.consumer_groups.target import Topics, preferred_assignor, subscribed_ids
from kafscale.coordinator.group_model import (
    ConsumerGroupStore,
    Group,
    NotCoordinator,
    store_error,
)
from kafscale.ipc import messages
from kafscale.ipc.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerGroupHeartbeat,
    ConsumerGroupHeartbeatResult,
    ConsumerMemberDescription,
    TopicIdPartitions,
)
from kafscale.metadata.group_records import ConsumerGroupRecord, ConsumerMemberRecord
from kafscale.metadata.records import GroupRecord
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

CONSUMER = "consumer"


class ConsumerGroups:
    def __init__(
        self,
        settings: ConsumerSettings,
        store: ConsumerGroupStore,
        coordinates: Callable[[str], bool],
        topics: Callable[[], Topics],
        group_configs: Callable[[], Mapping[str, dict[str, str]]] = dict,
    ) -> None:
        """``topics()``: the cluster's topics now (name -> (id, partition count));
        ``group_configs()``: the configs set on groups (IncrementalAlterConfigs), by group id."""
        self.settings = settings
        self.group_configs = group_configs
        self.store = store
        self.coordinates = coordinates
        self.topics = topics
        self.groups: dict[str, ConsumerGroup] = {}
        self.rebalances = 0  # group epoch bumps, for metrics
        self.fenced: list[str] = []  # why members were removed, for metrics
        self.upgraded: list[str] = []  # classic groups upgraded, for the classic side to drop
        self.downgraded: list[GroupRecord] = []  # groups become classic, for the classic side

    def load(
        self, stored: dict[str, tuple[ConsumerGroupRecord, list[ConsumerMemberRecord]]], now: int
    ) -> None:
        for group_id, (record, members) in stored.items():
            self.groups[group_id] = ConsumerGroup.restore(
                record, members, now, self.settings_of(group_id).session_timeout_ms
            )

    def settings_of(self, group_id: str) -> ConsumerSettings:
        """The broker's settings with the group's own session timeout and heartbeat interval."""
        configs = self.group_configs().get(group_id)
        if not configs:
            return self.settings
        session = configs.get("consumer.session.timeout.ms")
        heartbeat = configs.get("consumer.heartbeat.interval.ms")
        return dataclasses.replace(
            self.settings,
            session_timeout_ms=int(session) if session else self.settings.session_timeout_ms,
            heartbeat_interval_ms=(
                int(heartbeat) if heartbeat else self.settings.heartbeat_interval_ms
            ),
        )

    def forget(self, group_ids: Iterable[str]) -> None:
        for group_id in group_ids:
            self.groups.pop(group_id, None)

    def is_active(self, group_id: str) -> bool:
        """A consumer group with members: the id is not the classic protocol's."""
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    # -- ConsumerGroupHeartbeat ------------------------------------------------------------------

    def heartbeat(
        self, request: ConsumerGroupHeartbeat, classic: Group | None, now: int
    ) -> ConsumerGroupHeartbeatResult:
        """``classic``: the classic group of that id, if it has members: the first member's
        heartbeat upgrades it (``migration.upgrade``), if the policy allows."""
        if not self.coordinates(request.group_id):
            return ConsumerGroupHeartbeatResult(
                int(ErrorCode.not_coordinator), None, request.member_id or None
            )
        group = self.groups.get(request.group_id)
        settings = self.settings_of(request.group_id)
        topics = self.topics()
        upgraded: Group | None = None
        if group is None and classic is not None:
            if request.member_epoch != 0:
                message = f"Group {request.group_id} is not a consumer group."
                return ConsumerGroupHeartbeatResult(
                    int(ErrorCode.group_id_not_found), message, request.member_id or None
                )
            try:
                group = migration.upgrade(classic, settings.migration_policy, settings, topics, now)
            except machine.HeartbeatError as exc:
                return ConsumerGroupHeartbeatResult(
                    int(exc.code), exc.message, request.member_id or None
                )
            upgraded = classic
        step = machine.heartbeat(group, request, settings, topics, now)
        assert step.reply is not None
        if upgraded is not None:
            if step.reply.error_code or step.group is None:
                return step.reply  # a refused join upgrades nothing
            step.changed |= set(step.group.members) - step.removed  # everything of it is new
            step.group_changed = True
        error = self._keep(request.group_id, step, upgraded)
        if error is not None:
            return ConsumerGroupHeartbeatResult(int(error), None, request.member_id or None)
        if upgraded is not None:
            self.upgraded.append(request.group_id)
            log.info(
                "classic group upgraded to a consumer group",
                extra={"group": request.group_id, "members": len(upgraded.members)},
            )
        self._maybe_downgrade(request.group_id)
        return step.reply

    def _maybe_downgrade(self, group_id: str) -> None:
        """Only classic members left: the group becomes a classic group again, if the policy
        allows (``migration.downgrade``); if the write fails it stays a consumer group and the
        next tick tries again."""
        group = self.groups.get(group_id)
        if not migration.downgrade_due(group, self.settings_of(group_id).migration_policy):
            return
        assert group is not None
        record = migration.downgrade(group, self.topics())
        if record is None:
            return
        try:
            self.store.downgrade_consumer(group_id, record)
        except Exception as exc:
            extra = {"group": group_id, "error": str(exc)}
            log.warning("cannot downgrade consumer group yet", extra=extra)
            return
        del self.groups[group_id]
        self.downgraded.append(record)
        log.info(
            "consumer group downgraded to a classic group",
            extra={"group": group_id, "members": len(record.members)},
        )

    # -- classic members (online migration) ------------------------------------------------------

    def classic_join(self, request: messages.JoinGroup, now: int) -> messages.JoinGroupResult:
        group = self.groups[request.group_id]
        settings = self.settings_of(request.group_id)
        step, reply = migration.join(group, request, settings, self.topics(), now)
        error = self._keep(request.group_id, step)
        if error is not None:
            return messages.JoinGroupResult(int(error), member_id=request.member_id)
        return reply

    def classic_sync(self, request: messages.SyncGroup, now: int) -> messages.SyncGroupResult:
        step, reply = migration.sync(self.groups[request.group_id], request, self.topics(), now)
        self._keep(request.group_id, step)  # a session refreshed: nothing to write
        return reply

    def classic_heartbeat(self, request: messages.Heartbeat, now: int) -> messages.GroupError:
        step, reply = migration.heartbeat(self.groups[request.group_id], request, now)
        self._keep(request.group_id, step)
        return reply

    def classic_leave(self, request: messages.LeaveGroup) -> messages.LeaveGroupResult:
        step, reply = migration.leave(self.groups[request.group_id], request)
        error = self._keep(request.group_id, step)
        if error is not None:
            code = int(error)
            return messages.LeaveGroupResult(
                code, [(m.member_id, m.group_instance_id, code) for m in request.members]
            )
        return reply

    def _keep(self, group_id: str, step: Step, upgraded: Group | None = None) -> ErrorCode | None:
        """Store the step, then keep its group; the error to answer if the store refused.
        ``upgraded``: the classic group the step turns into this consumer group, stored
        without its members in the same write."""
        group = step.group
        if group is None:
            return None
        if step.writes:
            emptied = None
            if upgraded is not None:
                emptied = GroupRecord(group_id, "", None, upgraded.generation, None, [])
            try:
                self.store.save_consumer(
                    group_id,
                    [group.members[m].record() for m in sorted(step.changed)],
                    step.removed,
                    group.record() if step.group_changed else None,
                    emptied,
                )
            except Exception as exc:
                extra = {"group": group_id, "error": str(exc)}
                if isinstance(exc, NotCoordinator):
                    log.warning("not stored: no longer the group's coordinator", extra=extra)
                else:
                    log.error("cannot store consumer group", extra=extra)
                return store_error(exc)
        old = self.groups.get(group_id)
        self.rebalances += group.epoch - (old.epoch if old is not None else 0)
        for member_id, why in step.fenced.items():
            self.fenced.append(why)
            log.info(
                "member removed from consumer group",
                extra={"group": group_id, "member": member_id, "reason": why},
            )
        self.groups[group_id] = group
        return None

    # -- time and topics -------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        topics: Topics | None = None
        for group_id, group in list(self.groups.items()):
            idle = group.epoch <= group.assignment_epoch
            if idle and not group.sessions and not group.revocations:
                continue
            topics = topics if topics is not None else self.topics()
            step = machine.tick(group, self.settings_of(group_id), topics, now)
            if step is not None:
                self._keep(group_id, step)
            self._maybe_downgrade(group_id)

    def topics_changed(self, now: int) -> None:
        """The cluster's topics changed: groups subscribed to one that changed rebalance."""
        topics = self.topics()
        for group_id, group in list(self.groups.items()):
            if group.members:
                step = machine.topics_changed(group, self.settings_of(group_id), topics, now)
                if step is not None:
                    self._keep(group_id, step)

    # -- administration --------------------------------------------------------------------------

    def describe(self, group_ids: list[str]) -> list[ConsumerGroupDescription]:
        described = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if not self.coordinates(group_id):
                described.append(ConsumerGroupDescription(group_id, int(ErrorCode.not_coordinator)))
            elif group is None:
                described.append(
                    ConsumerGroupDescription(
                        group_id,
                        int(ErrorCode.group_id_not_found),
                        f"Group {group_id} not found.",
                    )
                )
            else:
                described.append(self._description(group))
        return described

    def _description(self, group: ConsumerGroup) -> ConsumerGroupDescription:
        return ConsumerGroupDescription(
            group.group_id,
            int(ErrorCode.none),
            None,
            group.state().value,
            group.epoch,
            group.assignment_epoch,
            preferred_assignor(group, self.settings),
            [
                ConsumerMemberDescription(
                    m.member_id,
                    m.instance_id,
                    m.rack_id,
                    m.member_epoch,
                    m.client_id,
                    m.client_host,
                    list(m.subscribed_topic_names),
                    m.subscribed_topic_regex,
                    _wire(m.assigned),
                    _wire(m.target),
                    m.classic is not None,
                )
                for m in sorted(group.members.values(), key=lambda m: m.member_id)
            ],
        )

    def listings(self, states: set[str]) -> list[messages.GroupListing]:
        return [
            messages.GroupListing(g.group_id, CONSUMER, g.state().value, CONSUMER)
            for g in self.groups.values()
            if (not states or g.state().value.lower() in states) and self.coordinates(g.group_id)
        ]

    def delete(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups of a consumer group: NON_EMPTY_GROUP while it has members; its keys go,
        then (the caller) its offsets. None: not a consumer group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if group.members:
            return ErrorCode.non_empty_group
        try:
            self.store.delete_consumer(group_id)
        except Exception as exc:
            extra = {"group": group_id, "error": str(exc)}
            log.warning("cannot delete consumer group", extra=extra)
            return store_error(exc)
        del self.groups[group_id]
        return ErrorCode.none

    def drop_empty(self, group_id: str) -> ErrorCode | None:
        """A classic JoinGroup takes over an empty consumer group id: its keys go (its offsets
        stay). The error to answer if the store refused."""
        group = self.groups.get(group_id)
        if group is None or group.members:
            return None
        try:
            self.store.delete_consumer(group_id)
        except Exception as exc:
            return store_error(exc)
        del self.groups[group_id]
        return None

    def subscribed_names(self, group_id: str) -> set[str]:
        """The topics the group's members consume now (by name or regex)."""
        group = self.groups.get(group_id)
        if group is None:
            return set()
        topics = self.topics()
        by_id = {topic_id: name for name, (topic_id, _) in topics.items()}
        ids: set[str] = set()
        for member in group.members.values():
            ids |= subscribed_ids(member, topics)
        return {by_id[i] for i in ids if i in by_id}

    # -- offsets ---------------------------------------------------------------------------------

    def commit_error(self, request: messages.OffsetCommit) -> ErrorCode | None:
        """Why a member may not commit to this consumer group now (None: it may). Only for
        consumer groups (``request.group_id in self.groups``)."""
        group = self.groups[request.group_id]
        if request.generation_id < 0 and not group.members:
            return None  # an admin, or a consumer using assign()
        member = group.members.get(request.member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member.classic is not None:  # its generation is its member epoch, any version
            if request.generation_id != member.member_epoch:
                return ErrorCode.illegal_generation
            return None
        if request.version < 9:
            return ErrorCode.unsupported_version
        if request.generation_id != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    def fetch_error(self, query: messages.GroupOffsetsQuery) -> ErrorCode | None:
        group = self.groups.get(query.group_id)
        if group is None or (query.member_epoch < 0 and not query.member_id):
            return None
        member = group.members.get(query.member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if query.member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    def states(self) -> dict[GroupState, int]:
        counts = dict.fromkeys(GroupState, 0)
        for group in self.groups.values():
            counts[group.state()] += 1
        return counts


def _wire(partitions: Partitions) -> list[TopicIdPartitions]:
    return [TopicIdPartitions(topic, sorted(p)) for topic, p in sorted(partitions.items()) if p]
