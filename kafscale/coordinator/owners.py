"""The coordinator's side of partition ownership: runs ``OwnerState`` against etcd and the shards.

docs/design/scale-out.md, section 5. ``OwnerState`` (pure) decides; this module does the I/O:

- It follows the cluster with its own watched view (brokers, topics, leader keys) and feeds it to
  the state machine at most every ``VIEW_INTERVAL_MS`` (a view per change would recompute the
  assignment for every one of a thousand claims in a wave).
- ``Claim``: per topic, one read of the topic record and one of its partition records, then
  claim transactions of up to ``CLAIMS_PER_TXN`` partitions each; a batch that fails (one of its
  partitions was claimed or changed meanwhile) is retried partition by partition.
- ``Seal``: a ``SealPartition`` notice to the partition's shard, sent again every
  ``RESEAL_MS`` until ``PartitionSealed`` comes back (a respawned shard lost the first); then
  ``DeleteLeader``: the release transaction.
- ``Open``/``Close``: shards follow the leader keys themselves (their own watched view), so
  these are logged and told to the listeners (``opened``/``closed``: the group service, which
  coordinates the groups of the ``__consumer_offsets`` partitions this broker owns); a closed
  partition's shard drops it when its view loses our key. A hand-over (``Seal``) closes it for
  the listeners at once.
- It answers the committers (``leadership.Leaders``): our leader record of a partition we own or
  are handing over, so every commit is fenced on it; a fenced commit closes the partition at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import zmq

from kafscale.coordinator import leadership
from kafscale.coordinator.assignment import Partition, TopicPartitions
from kafscale.coordinator.owner_state import (
    Claim,
    ClaimDone,
    Close,
    DeleteLeader,
    DrainStarted,
    Fenced,
    Instruction,
    Open,
    OwnerState,
    ReleaseDone,
    Seal,
    Sealed,
    Tick,
    ViewChanged,
)
from kafscale.ipc import endpoints, messages
from kafscale.ipc.routing import shard_for
from kafscale.ipc.rpc import REQUEST_ID, Incoming
from kafscale.ipc.write_path import PartitionSealed, SealPartition
from kafscale.metadata import records
from kafscale.metadata.records import Keys, LeaderRecord
from kafscale.metadata.store import KeyValue, MetadataStore, MetadataStoreError
from kafscale.metadata.view import MetadataView, Snapshot

log = logging.getLogger(__name__)

VIEW_INTERVAL_MS = 100
CLAIMS_PER_TXN = 32  # 3 compares + 2 puts each: within etcd's 128 operations
RESEAL_MS = 1_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Owners:
    """Implements ``leadership.Leaders`` for the committers."""

    def __init__(
        self,
        store: MetadataStore,
        namespace: str,
        state: OwnerState,
        context: zmq.Context[zmq.Socket[bytes]],
        runtime_dir: str,
        shards: int,
    ) -> None:
        self.store = store
        self.keys = Keys(namespace)
        self.state = state
        self.view = MetadataView(store, namespace)
        self._changed = threading.Event()
        self._next_view_ms = 0
        self._resealed_ms: dict[Partition, int] = {}
        self._topic_ids: dict[str, str] = {}
        # Told when a partition becomes ours (opened) and when it stops being served by us
        # (closed, or being handed over): the group service follows __consumer_offsets this way.
        self.opened: list[Callable[[Partition, LeaderRecord], None]] = []
        self.closed: list[Callable[[Partition], None]] = []
        self._shards: list[zmq.Socket[bytes]] = []
        for index in range(shards):
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.connect(endpoints.address(runtime_dir, "shard", index))
            self._shards.append(socket)

    # -- life --------------------------------------------------------------------------------

    def start(self, now_ms: int) -> None:
        """Load the view and make the first claims (before the coordinator reports ready, so
        the shards and the flusher's boot recovery find this broker's partitions claimed)."""
        self.view.on_change(lambda _: self._changed.set())
        self.view.start()
        self._feed_view(now_ms)

    def tick(self, now_ms: int) -> None:
        self._run(self.state.handle(Tick(now_ms)))
        if self._changed.is_set() and now_ms >= self._next_view_ms:
            self._feed_view(now_ms)
        for partition, sealing in self.state.sealing.items():
            if now_ms - self._resealed_ms.get(partition, 0) >= RESEAL_MS:
                self._send_seal(partition, sealing.leader, now_ms)

    def handle_drain(self, incoming: Incoming) -> messages.Draining:
        """Hand everything over (started by the first ``Drain``); how much is left."""
        if not self.state.draining:
            log.info(
                "draining: handing every partition over", extra={"owned": len(self.state.owned)}
            )
            self._run(self.state.handle(DrainStarted(_now_ms())))
        state = self.state
        left = len(state.owned) + len(state.sealing) + len(state.deleting) + len(state.claiming)
        return messages.Draining(remaining=left)

    def close(self) -> None:
        self.view.stop()
        for socket in self._shards:
            socket.close(linger=0)

    # -- leadership.Leaders ------------------------------------------------------------------

    def leader(self, topic: str, partition: int) -> LeaderRecord | None:
        key = (topic, partition)
        owned = self.state.owned.get(key)
        if owned is not None:
            return owned
        sealing = self.state.sealing.get(key)
        return sealing.leader if sealing is not None else None

    def fenced(self, topic: str, partition: int, epoch: int) -> None:
        self._run(self.state.handle(Fenced((topic, partition), epoch)))

    # -- shards' notices ---------------------------------------------------------------------

    def handle_sealed(self, incoming: Incoming) -> None:
        notice = incoming.message
        assert isinstance(notice, PartitionSealed)
        partition = (notice.topic, notice.partition)
        self._resealed_ms.pop(partition, None)
        self._run(self.state.handle(Sealed(partition, notice.leader_epoch)))

    # -- instructions --------------------------------------------------------------------------

    def _feed_view(self, now_ms: int) -> None:
        self._changed.clear()
        self._next_view_ms = now_ms + VIEW_INTERVAL_MS
        self._run(self.state.handle(self._view_event(self.view.snapshot)))

    def _view_event(self, snapshot: Snapshot) -> ViewChanged:
        self._topic_ids = {name: t.topic_id for name, t in snapshot.topics.items()}
        return ViewChanged(
            revision=snapshot.revision,
            brokers={node: broker.draining for node, broker in snapshot.brokers.items()},
            topics=tuple(
                TopicPartitions(t.name, t.topic_id, t.partitions) for t in snapshot.topics.values()
            ),
            leaders=snapshot.leaders,
            booting=frozenset(node for node, b in snapshot.brokers.items() if not b.ready),
        )

    def _run(self, instructions: Iterable[Instruction]) -> None:
        pending = list(instructions)
        while pending:
            instruction = pending.pop(0)
            pending += self._execute(instruction)

    def _execute(self, instruction: Instruction) -> list[Instruction]:
        match instruction:
            case Claim(partitions):
                return self._claim(partitions)
            case Seal(partition, leader):
                log.info(
                    "handing a partition over",
                    extra={"topic": partition[0], "partition": partition[1], "epoch": leader.epoch},
                )
                self._tell(self.closed, partition)
                self._send_seal(partition, leader, 0)
                return []
            case DeleteLeader(partition, leader):
                return self._release(partition, leader)
            case Open(partition, leader):
                log.debug(
                    "owning a partition",
                    extra={"topic": partition[0], "partition": partition[1], "epoch": leader.epoch},
                )
                self._tell(self.opened, partition, leader)
                return []
            case Close(partition, leader, reason):
                self._tell(self.closed, partition)
                log.warning(
                    "lost a partition",
                    extra={
                        "topic": partition[0],
                        "partition": partition[1],
                        "epoch": leader.epoch,
                        "reason": reason,
                    },
                )
                return []
        raise TypeError(f"not an instruction: {instruction!r}")  # pragma: no cover

    @staticmethod
    def _tell(listeners: list[Callable[..., None]], *args: object) -> None:
        for listener in listeners:
            try:
                listener(*args)
            except Exception:  # a listener's bug must not stop ownership
                log.exception("an ownership listener failed")

    def _claim(self, partitions: tuple[Partition, ...]) -> list[Instruction]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in partitions:
            by_topic[topic].append(partition)
        out: list[Instruction] = []
        for topic, numbers in sorted(by_topic.items()):
            out += self._claim_topic(topic, sorted(numbers))
        return out

    def _claim_topic(self, topic: str, numbers: list[int]) -> list[Instruction]:
        state = self.state
        try:
            topic_kv = self.store.get(self.keys.topic(topic))
            current = self._partition_records(topic, topic_kv, numbers)
        except MetadataStoreError as exc:
            log.warning("cannot claim partitions", extra={"topic": topic, "error": str(exc)})
            return self._not_claimed(topic, numbers)
        if topic_kv is None:
            return self._not_claimed(topic, numbers)
        claims = []
        for number in numbers:
            try:
                claims.append(
                    leadership.claim(
                        self.keys,
                        topic_kv,
                        number,
                        current.get(number),
                        state.me,
                        state.lease,
                        state.run_id,
                    )
                )
            except ValueError as exc:  # the topic shrank or changed meanwhile
                log.warning("not claiming", extra={"topic": topic, "error": str(exc)})
                return self._not_claimed(topic, numbers)
        out: list[Instruction] = []
        for start in range(0, len(claims), CLAIMS_PER_TXN):
            batch = claims[start : start + CLAIMS_PER_TXN]
            out += self._run_claims(batch, alone=len(batch) == 1)
        return out

    def _partition_records(
        self, topic: str, topic_kv: KeyValue | None, numbers: list[int]
    ) -> dict[int, KeyValue]:
        """The partition records of ``numbers``: one read of the topic's records when they are
        a good part of it, else one read each (a wave of claims over a topic of 100,000
        partitions must not read them all for every 256)."""
        size = records.decode_topic(topic_kv.value).partitions if topic_kv is not None else 0
        if len(numbers) * 8 < size:
            found = {n: self.store.get(self.keys.partition(topic, n)) for n in numbers}
            return {n: kv for n, kv in found.items() if kv is not None}
        prefix = self.keys.topic_partitions(topic)
        return {
            int(kv.key[len(prefix) :]): kv
            for kv in self.store.get_prefix(prefix)
            if kv.key[len(prefix) :].isdigit()
        }

    def _not_claimed(self, topic: str, numbers: list[int]) -> list[Instruction]:
        return [i for n in numbers for i in self.state.handle(ClaimDone((topic, n), None))]

    def _run_claims(self, batch: list[leadership.ClaimTxn], alone: bool) -> list[Instruction]:
        compares = [c for claim in batch for c in claim.compares]
        operations = [o for claim in batch for o in claim.operations]
        try:
            result = self.store.transaction(compares, operations)
        except MetadataStoreError as exc:
            log.warning("claim failed", extra={"error": str(exc)})
            return [
                i
                for claim in batch
                for i in self.state.handle(ClaimDone((claim.topic, claim.partition), None))
            ]
        if result.succeeded:
            out: list[Instruction] = []
            for claim in batch:
                log.info(
                    "claimed a partition",
                    extra={
                        "topic": claim.topic,
                        "partition": claim.partition,
                        "epoch": claim.leader.epoch,
                        "high_watermark": claim.record.high_watermark,
                    },
                )
                done = ClaimDone((claim.topic, claim.partition), claim.leader, result.revision)
                out += self.state.handle(done)
            return out
        if alone:
            return self.state.handle(ClaimDone((batch[0].topic, batch[0].partition), None))
        return [i for claim in batch for i in self._run_claims([claim], alone=True)]

    def _release(self, partition: Partition, leader: LeaderRecord) -> list[Instruction]:
        compares, operations = leadership.release(self.keys, *partition, leader)
        try:
            result = self.store.transaction(compares, operations)
        except MetadataStoreError as exc:
            log.warning(
                "cannot release a partition yet",
                extra={"topic": partition[0], "partition": partition[1], "error": str(exc)},
            )
            return self.state.handle(ReleaseDone(partition, leader.epoch, succeeded=False))
        if result.succeeded:
            log.info(
                "released a partition",
                extra={"topic": partition[0], "partition": partition[1], "epoch": leader.epoch},
            )
        # Not succeeded: the key is no longer ours (our lease ran out, or it was deleted): done.
        return self.state.handle(ReleaseDone(partition, leader.epoch, succeeded=True))

    def _send_seal(self, partition: Partition, leader: LeaderRecord, now_ms: int) -> None:
        self._resealed_ms[partition] = now_ms
        topic_id = self._topic_ids.get(partition[0])
        if topic_id is None:
            return  # the topic is gone: the state machine closes it on the next view
        socket = self._shards[shard_for(topic_id, partition[1], len(self._shards))]
        notice = SealPartition(partition[0], partition[1], leader.epoch)
        with contextlib.suppress(zmq.Again):  # a restarting shard: sent again in RESEAL_MS
            socket.send_multipart([REQUEST_ID.pack(0), messages.encode(notice)], flags=zmq.NOBLOCK)
