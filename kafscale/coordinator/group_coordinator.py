"""The classic group state machine (``groups.ClassicGroups``) with its instructions carried out:
``GroupCoordinator`` is what the coordinator's group service calls.

Each request goes to the machine, whose instructions run here in order: a ``Reply`` is sent (or,
for a request answered at once, returned), a ``Write`` is made on the ``GroupStore`` and then its
``done`` continuation runs, or its ``failed`` one with the error the request is answered (a
refused write is logged here, once). A continuation's instructions run before the rest of the
list, so the order is the one the machine decided.

The consumer (KIP-848) groups of the same ids are asked here, not by the machine, when a classic
JoinGroup needs an id they hold (an active consumer group refuses it, an empty one makes way) and
when DeleteGroups deletes one.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

from kafscale.coordinator.consumer_groups.coordinator import ConsumerGroups
from kafscale.coordinator.consumer_groups.model import ConsumerSettings
from kafscale.coordinator.group_model import (
    Change,
    DeleteGroup,
    DeleteOffsets,
    Group,
    GroupSettings,
    GroupStore,
    Instructions,
    Reply,
    SaveGroup,
    SaveOffsets,
    Send,
    Token,
    TopicPartition,
    Write,
    store_error,
)
from kafscale.coordinator.groups import ClassicGroups, join_failure
from kafscale.ipc import messages
from kafscale.metadata.records import GroupRecord, OffsetRecord
from kafscale.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

M = TypeVar("M", bound=messages.Message)


class _Answer:
    """The token of a request answered at once: its reply is the call's return value."""


class GroupCoordinator:
    """``GroupCoordinator(settings, store, send, coordinates, consumer)``: the machine
    (``ClassicGroups``) with its instructions carried out -- writes on ``store``, late answers
    through ``send(token, message)``, the others returned."""

    def __init__(
        self,
        settings: GroupSettings,
        store: GroupStore,
        send: Send,
        coordinates: Callable[[str], bool],
        consumer: ConsumerGroups | None = None,
    ) -> None:
        self.consumer = consumer or ConsumerGroups(
            ConsumerSettings(), store, coordinates, lambda: {}
        )
        self.machine = ClassicGroups(settings, coordinates, self.consumer)
        self.store = store
        self.send = send

    @property
    def groups(self) -> dict[str, Group]:
        return self.machine.groups

    @property
    def rebalances(self) -> int:
        return self.machine.rebalances

    def run(self, instructions: Instructions) -> messages.Message | None:
        """Carry ``instructions`` out in order, each write's continuation before the rest; the
        answer to an ``_Answer`` token, if there is one."""
        answer: messages.Message | None = None
        queue = deque(instructions)
        while queue:
            step = queue.popleft()
            if isinstance(step, Reply):
                if isinstance(step.token, _Answer):
                    answer = step.message
                else:
                    self.send(step.token, step.message)
                continue
            try:
                self._write(step.change)
            except Exception as exc:
                queue.extendleft(reversed(step.failed(self._refused(step, exc))))
            else:
                queue.extendleft(reversed(step.done()))
        return answer

    def _write(self, change: Change) -> None:
        match change:
            case SaveGroup(record):
                self.store.save_group(record)
            case DeleteGroup(group_id, partitions):
                self.store.delete_group(group_id, partitions)
            case SaveOffsets(group_id, offsets):
                self.store.save_offsets(group_id, dict(offsets))
            case DeleteOffsets(group_id, partitions):
                self.store.delete_offsets(group_id, partitions)

    def _refused(self, write: Write, exc: Exception) -> ErrorCode:
        code = store_error(exc)
        extra = {"group": write.group_id, "what": write.what, "error": str(exc)}
        if code is ErrorCode.not_coordinator:
            log.warning("not stored: no longer the group's coordinator", extra=extra)
        else:
            log.error("cannot store group", extra=extra)
        return code

    def _answer(self, instructions: Instructions, kind: type[M]) -> M:
        answer = self.run(instructions)
        assert isinstance(answer, kind), f"answered {answer!r}, not a {kind.__name__}"
        return answer

    # -- requests ------------------------------------------------------------------------------

    def join(self, token: Token, request: messages.JoinGroup, now: int) -> None:
        """A consumer group with members takes classic members in (KIP-848's online
        migration); an empty one makes way for a classic group."""
        refused = self.machine.join_error(request)
        if refused is None and self.consumer.is_active(request.group_id):
            self.send(token, self.consumer.classic_join(request, now))
            return
        if refused is None:
            refused = self.consumer.drop_empty(request.group_id)
        if refused is not None:
            self.run(join_failure(token, request, refused))
        else:
            self.run(self.machine.join(token, request, now))

    def sync(self, token: Token, request: messages.SyncGroup, now: int) -> None:
        if self._consumers(request.group_id):
            self.send(token, self.consumer.classic_sync(request, now))
        else:
            self.run(self.machine.sync(token, request, now))

    def heartbeat(self, request: messages.Heartbeat, now: int) -> messages.GroupError:
        if self._consumers(request.group_id):
            return self.consumer.classic_heartbeat(request, now)
        return self._answer(self.machine.heartbeat(_Answer(), request, now), messages.GroupError)

    def leave(self, request: messages.LeaveGroup, now: int) -> messages.LeaveGroupResult:
        if self._consumers(request.group_id):
            return self.consumer.classic_leave(request)
        return self._answer(self.machine.leave(_Answer(), request, now), messages.LeaveGroupResult)

    def _consumers(self, group_id: str) -> bool:
        """Whether a consumer group of this id serves the classic requests (its classic
        members: online migration)."""
        return group_id in self.consumer.groups and self.machine.coordinates(group_id)

    def follow_migrations(self, now: int) -> None:
        """Groups that changed type on the consumer side: those it took over with their
        members (an online upgrade) keep only their offsets here; those it gave back (a
        downgrade) are classic groups again, rebalancing."""
        upgraded, self.consumer.upgraded = self.consumer.upgraded, []
        for group_id in upgraded:
            self.run(self.machine.release(group_id))
        downgraded, self.consumer.downgraded = self.consumer.downgraded, []
        for record in downgraded:
            self.run(self.machine.adopt(record, now))

    def commit(self, request: messages.OffsetCommit, now: int) -> messages.OffsetCommitResult:
        return self._answer(
            self.machine.commit(_Answer(), request, now), messages.OffsetCommitResult
        )

    def fetch_offsets(self, request: messages.OffsetFetch) -> messages.OffsetFetchResult:
        return self._answer(
            self.machine.fetch_offsets(_Answer(), request), messages.OffsetFetchResult
        )

    def delete_offsets(
        self, request: messages.OffsetDelete, subscribed: Callable[[Group], set[str]]
    ) -> messages.OffsetsDeleted:
        return self._answer(
            self.machine.delete_offsets(_Answer(), request, subscribed), messages.OffsetsDeleted
        )

    def describe(self, request: messages.DescribeGroups) -> messages.GroupsDescribed:
        return self._answer(self.machine.describe(_Answer(), request), messages.GroupsDescribed)

    def list_groups(self, request: messages.ListGroups) -> messages.GroupsListed:
        return self._answer(self.machine.list_groups(_Answer(), request), messages.GroupsListed)

    def delete(self, request: messages.DeleteGroups) -> messages.GroupsDeleted:
        """DeleteGroups: a consumer group's keys go first (its offsets then with the classic
        side's, as Kafka keeps them in one place)."""
        consumer = {
            group_id: self.consumer.delete(group_id) if self.machine.coordinates(group_id) else None
            for group_id in request.group_ids
        }
        return self._answer(
            self.machine.delete(_Answer(), request, consumer), messages.GroupsDeleted
        )

    # -- ownership and time --------------------------------------------------------------------

    def load(
        self,
        records: Iterable[GroupRecord],
        offsets: dict[str, dict[TopicPartition, OffsetRecord]],
        now: int,
    ) -> None:
        self.run(self.machine.load(records, offsets, now))

    def forget(self, group_ids: Iterable[str]) -> None:
        group_ids = list(group_ids)
        self.consumer.forget(group_ids)
        self.run(self.machine.forget(group_ids))

    def tick(self, now: int) -> None:
        self.run(self.machine.tick(now))

    def next_deadline(self) -> int | None:
        return self.machine.next_deadline()
