"""Where a shard's partition state comes from, and the buffers it creates.

- On first use (``load``): the committed partition record and segment list from the metadata
  store, plus any segment a previous version uploaded but never committed
  (``kafscale.shards.recovery``): looked for only in a topic that version created, and only
  until this version commits to the partition, so a load costs no object store request.
- At boot, before the shard serves anything (``adopt_predecessor``): the buffers a crashed
  predecessor left in shared memory (``kafscale.shards.restart``), continuing the committed
  record they were read against. Every partition holding such buffers is loaded then, so no
  append to it can be given an offset its predecessor already gave out.
- New buffers (``new_buffer``) are stamped with their owner (topic, topic id, partition) so a
  successor can adopt them, and numbered after every slot this incarnation has used or found. A
  successor cannot see the slots its predecessor destroyed (flushed), so such a name may come
  back; each buffer therefore starts at a generation no earlier buffer had (the creation time in
  nanoseconds), and a reader that attaches by name with an old ``WalEntry`` (a cycle of the
  predecessor still in flight at the flusher) is refused the new buffer's bytes, as after a reset.
"""

from __future__ import annotations

import functools
import logging
import time

from kafscale.config import Config
from kafscale.ipc.rpc import RpcClient
from kafscale.ipc.shm import BufferOwner, PartitionBuffer, segment_name
from kafscale.metadata import epochs, records
from kafscale.metadata.records import WRITE_PATH_WAL, Keys, PartitionRecord
from kafscale.metadata.store import MetadataStore
from kafscale.shards.adoption import Committed
from kafscale.shards.partition import PartitionLog
from kafscale.shards.producers import ProducerStates
from kafscale.shards.recovery import adopt_uncommitted
from kafscale.shards.restart import take_over
from kafscale.shards.segments import CommittedSegments
from kafscale.storage.objects import ObjectStore

log = logging.getLogger(__name__)


class PartitionLoader:
    def __init__(
        self,
        config: Config,
        store: MetadataStore,
        objects: ObjectStore,
        coordinator: RpcClient,
        run_id: str,
        shard: int,
    ) -> None:
        self.config = config
        self.store = store
        self.objects = objects
        self.coordinator = coordinator
        self.keys = Keys(config.s3_namespace)
        self.run_id, self.shard = run_id, shard
        self.last_slot = 0  # the highest slot number used (new buffers get the next ones)
        # TopicRecord.write_path by topic id (it never changes): read once per topic, not once
        # per partition.
        self._write_paths: dict[str, int] = {}

    def load(self, topic: str, topic_id: str, index: int, topic_created_ms: int) -> PartitionLog:
        """The partition as committed, after adopting the segments a previous version uploaded
        but never committed (if it can have left any)."""
        state = self._record(topic, topic_id, index)
        producers = ProducerStates.restore(state.producers)
        high_watermark = state.high_watermark
        if self._may_hold_uncommitted_segments(topic, topic_id, state):
            high_watermark = adopt_uncommitted(
                self.objects,
                self.coordinator,
                self.config.s3_namespace,
                topic,
                topic_id,
                index,
                state.high_watermark,
                producers,
                topic_created_ms=topic_created_ms,
            )
        owner = BufferOwner(topic, topic_id, index, topic_created_ms)
        partition = self._open(owner, state.log_start_offset, high_watermark, producers)
        partition.leader_epoch = state.leader_epoch
        partition.epochs = epochs.history(state.epochs, state.leader_epoch, state.log_start_offset)
        return partition

    def _may_hold_uncommitted_segments(
        self, topic: str, topic_id: str, state: PartitionRecord
    ) -> bool:
        """Whether a previous version (write path 1) can have left an uncommitted segment at
        the partition's high watermark: only worth an object store LIST if so.

        Not once a commit of this version happened (``wal_committed``), since one is only made
        after a load that adopted what there was; nor in a topic this version created, nor in a
        topic that is gone (the coordinator would refuse to commit into it)."""
        if state.wal_committed:
            return False
        write_path = self._write_paths.get(topic_id)
        if write_path is None:
            kv = self.store.get(self.keys.topic(topic))
            record = records.decode_topic(kv.value) if kv is not None else None
            if record is None or record.topic_id != topic_id:
                return False
            write_path = self._write_paths[topic_id] = record.write_path
        return write_path < WRITE_PATH_WAL

    def adopt_predecessor(self, now_ms: int) -> list[PartitionLog]:
        """The partitions rebuilt from a crashed predecessor's buffers. Raises (changing
        nothing) if the metadata store cannot be read."""
        read: dict[BufferOwner, PartitionRecord] = {}

        def committed_state(owner: BufferOwner) -> Committed:
            topic = self.store.get(self.keys.topic(owner.topic))
            if topic is None or records.decode_topic(topic.value).topic_id != owner.topic_id:
                return Committed(topic_exists=False)
            read[owner] = state = self._record(owner.topic, owner.topic_id, owner.partition)
            return Committed(True, state.high_watermark, state.producers)

        takeover = take_over(self.run_id, self.shard, committed_state)
        self.last_slot = max(self.last_slot, takeover.last_slot)
        loaded = []
        for adopted, buffers in takeover.partitions:
            owner, state = adopted.owner, read[adopted.owner]
            # The high watermark the plan was made against, even if a commit of a cycle of the
            # predecessor landed since: offering a committed buffer again is answered
            # "committed", and the log moves on from there.
            partition = self._open(
                owner, state.log_start_offset, adopted.high_watermark, ProducerStates()
            )
            # The predecessor appended at the epoch the record had when it loaded: if the
            # partition moved since, the coordinator refuses (fences) the commit of these.
            partition.leader_epoch = state.leader_epoch
            partition.epochs = epochs.history(
                state.epochs, state.leader_epoch, state.log_start_offset
            )
            partition.adopt(adopted, buffers, now_ms)
            loaded.append(partition)
        return loaded

    def _record(self, topic: str, topic_id: str, index: int) -> PartitionRecord:
        kv = self.store.get(self.keys.partition(topic, index))
        state = records.decode_partition(kv.value) if kv is not None else None
        if state is None or state.topic_id != topic_id:
            state = PartitionRecord(topic_id=topic_id)
        return state

    def _open(
        self,
        owner: BufferOwner,
        log_start_offset: int,
        high_watermark: int,
        producers: ProducerStates,
    ) -> PartitionLog:
        topic, index = owner.topic, owner.partition
        committed = CommittedSegments(
            segment
            for kv in self.store.get_prefix(self.keys.segments(topic, index))
            if (segment := records.decode_segment(kv.value)).last_offset < high_watermark
        )
        log.info(
            "partition loaded",
            extra={
                "topic": topic,
                "partition": index,
                "high_watermark": high_watermark,
                "segments": len(committed),
            },
        )
        return PartitionLog(
            topic,
            owner.topic_id,
            index,
            high_watermark,
            producers,
            self.config.segment_bytes,
            functools.partial(self.new_buffer, owner),
            segments=committed,
            log_start_offset=log_start_offset,
            topic_created_ms=owner.topic_created_ms,
        )

    def new_buffer(
        self, owner: BufferOwner, capacity: int, base_offset: int, codec: int
    ) -> PartitionBuffer:
        self.last_slot += 1
        name = segment_name(self.run_id, self.shard, self.last_slot)
        return PartitionBuffer.create(
            name, capacity, base_offset, owner=owner, codec=codec, generation=time.time_ns()
        )
