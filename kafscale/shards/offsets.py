"""ListOffsets for the partitions a shard owns: special offsets (latest, earliest, ...) at once,
timestamps by decoding records of the one log entry (or buffer) that can hold the answer.

Kafka's semantics (ListOffsets v1+): a timestamp finds the first record, by offset, whose
timestamp is at or after it; MAX_TIMESTAMP (-3, KIP-734) the first record with the largest
timestamp. Entries (spec segments or chunks of write-ahead objects) are chosen from their
committed max timestamps (``CommittedSegments``), so only one is read, from the L1 cache or whole
from the object store. An entry whose object is gone (compacted, cleaned or deleted since the
entry list was loaded) makes the read path reload the list; the lookup then runs once more.

Records are decoded on the read path's reader threads (``reads.find_timestamp``), never on the
shard's loop, with decompression bounded: a batch that does not decode (stored by something that
never validated it) is CORRUPT_MESSAGE for that partition, as Kafka answers, logged once; every
other partition of the request and every other request is served.

Each offset found is answered with the leader epoch that wrote it, from the partition's epoch
history (as Kafka's ``epochForOffset``; latest: the current epoch). A query carrying a
``leader_epoch`` is OffsetForLeaderEpoch's: where that epoch ends, from the same history, at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafscale.ipc import messages
from kafscale.ipc.rpc import Incoming
from kafscale.metadata import epochs
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol.errors import ErrorCode
from kafscale.shards import reads
from kafscale.shards.cache import Chunk, entry_key
from kafscale.shards.partition import PartitionLog
from kafscale.shards.reads import SegmentRef
from kafscale.storage.segment import CorruptBatch

if TYPE_CHECKING:
    from kafscale.shards.reader import ReadPath

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


@dataclass(eq=False)
class ListOp:
    incoming: Incoming
    answers: list[messages.OffsetAnswer]
    reading: int = 0
    reloaded: set[int] = field(default_factory=set)  # queries that had the entry list reloaded
    partitions: dict[int, PartitionLog] = field(default_factory=dict)  # of each query looked up


class OffsetLookups:
    """The ListOffsets half of a shard's ``ReadPath``: its caches, reader threads and object
    store health are the read path's."""

    def __init__(self, read_path: ReadPath) -> None:
        self.reads = read_path

    def on_list_offsets(self, incoming: Incoming, request: messages.ListOffsets) -> None:
        op = ListOp(incoming, [messages.OffsetAnswer()] * len(request.queries))
        for i, query in enumerate(request.queries):
            self._lookup(op, i, query)
        if op.reading == 0:
            self.reads.server.reply(incoming, messages.OffsetsListed(results=op.answers))

    def _lookup(self, op: ListOp, i: int, query: messages.OffsetQuery) -> None:
        partition = self.reads.partition_of(query.topic, query.topic_id, query.partition, query)
        if isinstance(partition, messages.OffsetAnswer):
            op.answers[i] = partition
            return
        op.partitions[i] = partition
        end = self.reads.visible_end(partition)
        timestamp = query.timestamp
        if query.leader_epoch is not None:
            # The end of the log visible to consumers: a consumer is never past it.
            epoch, offset = epochs.end_offset_for(partition.epochs, query.leader_epoch, end)
            op.answers[i] = messages.OffsetAnswer(offset=offset, leader_epoch=epoch)
        elif timestamp == LATEST:
            op.answers[i] = found_answer(partition, end)
        elif timestamp in (EARLIEST, EARLIEST_LOCAL):
            op.answers[i] = found_answer(partition, partition.log_start_offset)
        elif timestamp == LATEST_TIERED:
            # Nothing is "tiered" apart from the log itself: Kafka answers a topic without tiered
            # storage with no offset.
            op.answers[i] = messages.OffsetAnswer()
        elif timestamp < 0 and timestamp != MAX_TIMESTAMP:
            op.answers[i] = messages.OffsetAnswer(
                error_code=int(ErrorCode.invalid_request),
                message=f"unknown special timestamp {timestamp}",
            )
        else:
            self._search(op, i, partition, timestamp)

    def _search(self, op: ListOp, i: int, partition: PartitionLog, timestamp: int) -> None:
        """Find the first record with a timestamp >= ``timestamp`` (MAX_TIMESTAMP: the first
        record with the largest timestamp); whole segments are read, the one that holds it.
        Records are decoded on a reader thread, never on the shard's loop: a batch that does not
        decode is CORRUPT_MESSAGE for this partition (as Kafka answers), nothing more."""
        find_max = timestamp == MAX_TIMESTAMP
        segments = partition.segments
        segment = segments.max_timestamp() if find_max else segments.first_reaching(timestamp)
        buffered = [] if not self.reads.unflushed else [*partition.sealed]
        if self.reads.unflushed and partition.open is not None:
            buffered.append(partition.open)
        where = f"{partition.topic}-{partition.partition}"
        if find_max:
            best = segment.max_timestamp if segment is not None else -1
            later = [b for b in buffered if b.max_timestamp > best and b.size]
            if later:
                top = max(b.max_timestamp for b in later)
                first = next(b for b in later if b.max_timestamp == top)
                self._search_chunk(op, i, first.whole(), top, True, f"{where} buffer")
                return
            target = best
        else:
            target = timestamp
            if segment is None:
                reaching = [b for b in buffered if b.max_timestamp >= timestamp and b.size]
                if reaching:
                    self._search_chunk(op, i, reaching[0].whole(), timestamp, False, where)
                else:
                    op.answers[i] = messages.OffsetAnswer()
                return
        if segment is None:
            op.answers[i] = messages.OffsetAnswer()
            return
        self._search_entry(op, i, partition, segment, target, find_max, timestamp)

    def _search_entry(
        self,
        op: ListOp,
        i: int,
        partition: PartitionLog,
        segment: SegmentRecord,
        target: int,
        find_max: bool,
        timestamp: int,
    ) -> None:
        """``find_timestamp`` in a committed entry, cached or read whole on a reader thread."""
        key = entry_key(partition, segment)
        ref = SegmentRef.of(self.reads.namespace, partition.topic, partition.partition, segment)
        chunk = self.reads.cache.cached(key, segment.base_offset, whole=True)
        if chunk is not None:
            self._search_chunk(op, i, chunk, target, find_max, ref.where)
            return
        refusal = self.reads.refusal()
        if refusal is not None:
            op.answers[i] = error_answer(*refusal)
            return

        def done(
            result: tuple[Chunk, tuple[int, int] | None] | None, error: BaseException | None
        ) -> None:
            if self.reads.entry_gone(error) and i not in op.reloaded:
                op.reloaded.add(i)
                self.reads.gate.answered()
                self.reads.reload(
                    partition, lambda ok: self._again(op, i, partition, timestamp, ok, error)
                )
                return
            if result is not None:
                self.reads.healthy()
                self.reads.cache.store(key, result[0])
            self._searched(op, i, ref.where, None if result is None else result[1], error)

        op.reading += 1
        args = (self.reads.objects, ref, target, find_max, self.reads.decompression_factor)
        self.reads.submit(reads.search_segment, args, done)

    def _again(
        self,
        op: ListOp,
        i: int,
        partition: PartitionLog,
        timestamp: int,
        reloaded: bool,
        gone: BaseException | None,
    ) -> None:
        """After the entry list was reloaded for a chunk found gone: look up once more."""
        if reloaded:
            self._search(op, i, partition, timestamp)
        else:
            self._answer(op, i, f"{partition.topic}-{partition.partition}", None, gone)
        self._read_done(op)

    def _search_chunk(
        self, op: ListOp, i: int, chunk: Chunk, target: int, exact: bool, where: str
    ) -> None:
        def done(result: tuple[int, int] | None, error: BaseException | None) -> None:
            self._searched(op, i, where, result, error)

        op.reading += 1
        args = (chunk, target, exact, self.reads.decompression_factor, where)
        self.reads.submit(reads.find_timestamp, args, done)

    def _searched(
        self,
        op: ListOp,
        i: int,
        where: str,
        found: tuple[int, int] | None,
        error: BaseException | None,
    ) -> None:
        self._answer(op, i, where, found, error)
        self._read_done(op)

    def _answer(
        self,
        op: ListOp,
        i: int,
        where: str,
        found: tuple[int, int] | None,
        error: BaseException | None,
    ) -> None:
        if isinstance(error, CorruptBatch):
            self.reads.faults.report(where, str(error), api="ListOffsets")
            # The client learns which batch; the object key stays in the log.
            op.answers[i] = error_answer(ErrorCode.corrupt_message, error.fault)
        elif error is not None:
            op.answers[i] = error_answer(*self.reads.read_error(where, error))
        elif found is not None:
            offset, timestamp = found
            epoch = epochs.epoch_for_offset(op.partitions[i].epochs, offset)
            op.answers[i] = messages.OffsetAnswer(
                offset=offset, timestamp=timestamp, leader_epoch=epoch
            )
        else:
            op.answers[i] = messages.OffsetAnswer()

    def _read_done(self, op: ListOp) -> None:
        op.reading -= 1
        if op.reading == 0:
            self.reads.server.reply(op.incoming, messages.OffsetsListed(results=op.answers))


def found_answer(partition: PartitionLog, offset: int) -> messages.OffsetAnswer:
    epoch = epochs.epoch_for_offset(partition.epochs, offset)
    return messages.OffsetAnswer(offset=offset, leader_epoch=epoch)


def error_answer(code: ErrorCode, message: str | None) -> messages.OffsetAnswer:
    return messages.OffsetAnswer(error_code=int(code), message=message)
