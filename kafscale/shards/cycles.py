"""A shard's side of the flush cycles, I/O included (docs/design/write-path.md, sections 4-5).

The shard tells the flusher what no cycle holds yet (``ShardPending`` notices over its DEALER),
answers each ``Cut`` with every sealed buffer no cycle holds (``CutEntries``), and carries out
each ``ObjectCommitted``: a committed buffer moves its partition's high watermark and is freed
(its batches copied into the read cache, its entry added to the partition's list), a buffer that
was not committed is offered again at the next cut. What each event means is decided by
``kafscale.shards.flushes`` (pure); this module applies it to the partitions' buffers, the read
path, the waiting requests and the shard's admission of appends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from kafscale.config import Config
from kafscale.ipc import messages, write_path
from kafscale.ipc.rpc import REQUEST_ID
from kafscale.shards.admission import Admission
from kafscale.shards.flushes import Holds, Key, Outcome, PendingReport
from kafscale.shards.partition import PartitionLog
from kafscale.shards.reader import ReadPath

log = logging.getLogger(__name__)


class CycleLink:
    def __init__(
        self,
        shard: int,
        config: Config,
        flusher: zmq.Socket[Any],
        partitions: dict[Key, PartitionLog],
        reads: ReadPath,
        admission: Admission,
        waiting_since: Callable[[], int | None],
    ) -> None:
        self.shard = shard
        self.slow_ms = config.s3_latency_threshold_ms
        self.flusher = flusher
        self.partitions = partitions  # the shard's own dict, shared
        self.reads = reads
        self.admission = admission
        self.waiting_since = waiting_since  # since when the oldest waiting request waits
        self.holds = Holds()
        self.report = PendingReport(shard, config.object_bytes)
        self._last_error: str | None = None

    def urgent(self, since_ms: int) -> None:
        """A request (acks=all, a flush) waits, since ``since_ms``, on what no cycle holds."""
        self.report.urgent(since_ms)

    def on_cut(self, cut: write_path.Cut, now: int) -> write_path.CutEntries:
        """Seal every open buffer and hand over every sealed buffer no cycle holds."""
        for partition in self.partitions.values():
            partition.seal(now)
        offered = [(key, partition.sealed) for key, partition in self.partitions.items()]
        taken = self.holds.cut(cut.cycle, now, offered)
        self.report.cut()
        entries = [self.partitions[key].wal_entry(buffer) for key, buffer in taken]
        return write_path.CutEntries(cut.cycle, self.shard, entries)

    def on_committed(self, notice: write_path.ObjectCommitted, now: int) -> None:
        """The outcome of each buffer the shard gave to cycle ``notice.cycle``."""
        given_back = False
        for result in notice.results:
            key = (result.topic, result.partition)
            outcome = self.holds.settle(notice.cycle, key, result.base_offset, result.committed)
            partition = self.partitions.get(key)
            if partition is None or outcome is Outcome.IGNORED:
                continue
            if outcome is Outcome.COMMITTED:
                self._commit(key, partition, result)
            elif result.topic_gone:
                log.info(
                    "topic deleted: dropping the partition's buffers",
                    extra={"topic": result.topic, "partition": result.partition},
                )
                self.drop(key)
            else:
                given_back = True
                self._not_committed(key, result)
        if self.holds.answered(notice.cycle) or given_back:
            self.report.failed(now)
            self._given_back()
        if notice.upload_ms > self.slow_ms:
            log.warning("slow upload: refusing produce for a while", extra={"ms": notice.upload_ms})
            self.admission.slow(now)

    def on_compacted(self, notice: write_path.SegmentsCompacted) -> None:
        """The partition's chunk entries covered by ``notice.segment`` are now that segment."""
        partition = self.partitions.get((notice.topic, notice.partition))
        if partition is not None and partition.topic_id == notice.topic_id:
            self.reads.compacted(partition, notice.segment)

    def tick(self, now: int) -> None:
        for cycle, keys in self.holds.expire(now):
            log.error(
                "no answer to a cycle; its buffers are offered again",
                extra={"cycle": cycle, "partitions": len(keys)},
            )
            # No answer at all is a failing store too (a paused S3 answers nothing): keep
            # produce refused until these partitions commit.
            self.admission.failed(key for key in keys if key in self.partitions)
            self.report.failed(now)
            self._given_back()
        cut_ms = self.holds.oldest_cut_ms()
        if cut_ms is not None and now - cut_ms >= self.slow_ms and self.admission.slow(now):
            log.warning("a cycle is taking too long: refusing produce until cycles complete")
        self._send_report(now)

    def drop(self, key: Key) -> None:
        """Forget the partition and its buffers (its topic was deleted or re-created)."""
        partition = self.partitions.pop(key, None)
        if partition is not None:
            self.admission.unflushed -= partition.close()
        self.holds.forget(key)
        self.admission.recovered(key)

    def _commit(self, key: Key, partition: PartitionLog, result: write_path.EntryResult) -> None:
        segment = partition.sealed_at(result.base_offset)
        if segment is None:
            return
        chunk = segment.whole() if self.reads.segments.capacity >= segment.size else None
        freed = partition.committed(max(result.high_watermark, segment.last_offset + 1))
        for buffer in freed:
            self.holds.freed(key, buffer.base_offset)
            self.admission.unflushed -= buffer.size
        if result.segment is not None:
            self.reads.flushed(partition, chunk, result.segment)
        if result.segment is None or len(freed) > 1:
            # Committed by a cycle whose answer this shard did not take (an adopted buffer, a
            # cycle given up on): the metadata store has those entries, the shard's list not.
            self.reads.reload(partition, lambda _: self.reads.advanced(partition))
        self.admission.recovered(key)
        self.report.succeeded()

    def _not_committed(self, key: Key, result: write_path.EntryResult) -> None:
        if result.storage_error:
            self.admission.failed([key])
        if result.error != self._last_error:
            log.error(
                "a buffer was not committed; it will be offered again",
                extra={"topic": result.topic, "partition": result.partition, "error": result.error},
            )
        self._last_error = result.error

    def _given_back(self) -> None:
        """Buffers went back to pending: requests still waiting make them urgent again."""
        since = self.waiting_since()
        if since is not None:
            self.report.urgent(since)

    def _send_report(self, now: int) -> None:
        pending = self.admission.unflushed - self.holds.held_bytes
        notice = self.report.report(now, pending, lambda: self._oldest_ms(now))
        if notice is None:
            return
        try:  # never waited on: dropped if the flusher is long gone (reported again later)
            self.flusher.send_multipart(
                [REQUEST_ID.pack(0), messages.encode(notice)], flags=zmq.NOBLOCK
            )
        except zmq.Again:
            log.warning("the flusher takes no notices; reporting again later")

    def _oldest_ms(self, now: int) -> int:
        """The first append time of the oldest byte no cycle holds."""
        times = []
        for key, partition in self.partitions.items():
            if partition.open is not None and partition.open.size:
                times.append(partition.open.first_append_ms)
            for buffer in partition.sealed:
                if self.holds.holder(key, buffer.base_offset) is None:
                    times.append(buffer.first_append_ms)
        return min(times, default=now)
