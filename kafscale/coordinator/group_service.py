"""The coordinator's consumer-group service: the state machine (``groups``) on the coordinator's
request loop, with its store, its clock, its late answers and its metrics.

JoinGroup and SyncGroup are answered when the group is ready (the handler returns None and the
state machine replies through the server); everything else at once. Timeouts are checked every
``TICK_MS``; consumer lag is recomputed every ``LAG_MS`` from the high watermarks this process
commits (and, for partitions it has not committed since it started, from the metadata store).
"""

from __future__ import annotations

import logging
import struct
import time
from collections import Counter
from typing import TypeVar

from kafscale import metrics
from kafscale.coordinator.group_store import MetadataGroupStore
from kafscale.coordinator.groups import Group, GroupCoordinator, GroupSettings, GroupState
from kafscale.ipc import messages
from kafscale.ipc.rpc import Handler, Incoming, RpcServer
from kafscale.metadata import records
from kafscale.metadata.records import Keys
from kafscale.metadata.store import MetadataStore

log = logging.getLogger(__name__)

M = TypeVar("M", bound=messages.Message)

TICK_MS = 100
LAG_MS = 5_000
CONSUMER = "consumer"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupService:
    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        server: RpcServer,
        settings: GroupSettings,
        high_watermarks: dict[tuple[str, int], int],
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.server = server
        self.group_store = MetadataGroupStore(store, namespace)
        self.groups = GroupCoordinator(settings, self.group_store, self._send)
        self.high_watermarks = high_watermarks  # kept current by the partition committer
        self._next_tick = self._next_lag = 0
        self._rebalances = 0

    def load(self) -> None:
        loaded, offsets = self.group_store.load()
        self.groups.load(loaded, offsets, now_ms())
        log.info("groups loaded", extra={"groups": len(self.groups.groups)})

    def handlers(self) -> dict[type, Handler]:
        return {
            messages.JoinGroup: self._join,
            messages.SyncGroup: self._sync,
            messages.Heartbeat: lambda i: self.groups.heartbeat(
                _as(i, messages.Heartbeat), now_ms()
            ),
            messages.LeaveGroup: lambda i: self.groups.leave(_as(i, messages.LeaveGroup), now_ms()),
            messages.OffsetCommit: self._commit,
            messages.OffsetFetch: lambda i: self.groups.fetch_offsets(_as(i, messages.OffsetFetch)),
            messages.DescribeGroups: lambda i: self.groups.describe(
                _as(i, messages.DescribeGroups)
            ),
            messages.ListGroups: lambda i: self.groups.list_groups(_as(i, messages.ListGroups)),
            messages.DeleteGroups: lambda i: self.groups.delete(_as(i, messages.DeleteGroups)),
            messages.OffsetDelete: lambda i: self.groups.delete_offsets(
                _as(i, messages.OffsetDelete), subscribed_topics
            ),
        }

    def _send(self, token: Incoming, message: messages.Message) -> None:
        self.server.reply(token, message)

    def _join(self, incoming: Incoming) -> None:
        self.groups.join(incoming, _as(incoming, messages.JoinGroup), now_ms())

    def _sync(self, incoming: Incoming) -> None:
        self.groups.sync(incoming, _as(incoming, messages.SyncGroup), now_ms())

    def _commit(self, incoming: Incoming) -> messages.OffsetCommitResult:
        result = self.groups.commit(_as(incoming, messages.OffsetCommit), now_ms())
        metrics.OFFSET_COMMITS.inc(sum(1 for code in result.error_codes if code == 0))
        return result

    def tick(self) -> None:
        now = now_ms()
        if now < self._next_tick:
            return
        self._next_tick = now + TICK_MS
        self.groups.tick(now)
        states = Counter(group.state for group in self.groups.groups.values())
        for state in GroupState:
            metrics.GROUPS.labels(state.value).set(states.get(state, 0))
        metrics.GROUP_MEMBERS.set(sum(len(g.members) for g in self.groups.groups.values()))
        metrics.REBALANCES.inc(self.groups.rebalances - self._rebalances)
        self._rebalances = self.groups.rebalances
        if now >= self._next_lag:
            self._next_lag = now + LAG_MS
            self._update_lag()

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


def _as(incoming: Incoming, kind: type[M]) -> M:
    assert isinstance(incoming.message, kind)
    return incoming.message


def subscribed_topics(group: Group) -> set[str]:
    """The topics a consumer group's members subscribe to (ConsumerProtocolSubscription, any
    version: int16 version, then an array of int16-length strings)."""
    topics: set[str] = set()
    if group.protocol_type != CONSUMER or group.protocol is None:
        return topics
    for member in group.members.values():
        data = dict(member.protocols).get(group.protocol, b"")
        try:
            (count,) = struct.unpack_from(">i", data, 2)
            at = 6
            for _ in range(count):
                (size,) = struct.unpack_from(">h", data, at)
                topics.add(data[at + 2 : at + 2 + size].decode())
                at += 2 + size
        except (struct.error, UnicodeDecodeError):
            log.warning("undecodable subscription", extra={"member": member.member_id})
    return topics
