"""A shard worker: owns a fixed subset of partitions and their shared-memory append buffers.

The frontend routes each partition to its shard (``kafscale.ipc.routing``). For each Append the
shard validates the batch (``kafscale.protocol.records``), checks idempotence and assigns offsets
(``PartitionLog``), and answers: at once for acks=0/1, once the flusher reports the segment
committed for acks=all. Sealed buffers go to the flusher one partition-flush at a time.

A partition is loaded on first use from its committed state (``kafscale.shards.loading``). A
shard that restarts after a crash first adopts the buffers its predecessor left in shared memory
(verified, reconciled with the committed state: ``kafscale.shards.adoption``), before it reports
ready: acks=1 data survives the crash, offsets continue after it, and the adopted buffers are
flushed like any sealed buffer (a re-flush of a segment the predecessor's flush already uploaded
or committed builds the same bytes and is answered "committed").

Containment: an exception while serving one request is logged and answered with an error (for
an Append, per partition), and the loop goes on; so does one while finishing a read that
completed on a reader thread (that request is left to time out). Neither takes the shard down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import zmq

from kafscale import metrics
from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import REQUEST_ID, Incoming, RpcClient, RpcError, RpcServer
from kafscale.metadata import open_metadata_store
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.protocol import records as batches
from kafscale.protocol import validate
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.loading import PartitionLoader
from kafscale.shards.partition import BufferedSegment, PartitionLog, StaleTopic
from kafscale.shards.reader import ReadPath
from kafscale.storage import open_object_store
from kafscale.storage.metered import MeteredObjectStore
from kafscale.storage.objects import ObjectStore, ObjectStoreError
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)

TICK_MS = 20
FLUSH_RETRY_MS = 500
# A flush with no answer by then is presumed lost (the flusher died with it) and sent again;
# a late answer to the first attempt is ignored, and the retry uploads the same bytes.
FLUSH_TIMEOUT_MS = 10_000
SLOW_PENALTY_MS = 2_000
FLUSH_ALL_TIMEOUT_MS = 60_000  # how long a slow upload keeps produce refused
ACKS_ALL = -1
UNAVAILABLE = "cannot load the partition: the object store or metadata store is unavailable"
NOTICES = (messages.LogStartMoved, messages.ReleaseFetch)  # nobody waits on an answer to these


@dataclass
class PendingProduce:
    """An acks=all request (or an explicit flush) waiting for its partitions' commits."""

    incoming: Incoming
    results: list[messages.AppendResult]
    waits: dict[int, tuple[PartitionLog, int]]  # result index -> (log, last offset)
    deadline_ms: int
    flush_all: bool = False


@dataclass
class FlushState:
    retry_at_ms: int = 0
    topic_created_ms: int = 0
    in_flight: int = -1  # base offset of the flush in flight
    sent_ms: int = 0
    attempt: int = 0  # distinguishes a retry's answer from a lost attempt's
    failures: int = 0
    last_error: str | None = field(default=None)


class Shard:
    def __init__(self, ctx: ChildContext, store: MetadataStore, objects: ObjectStore) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.store = store
        self.objects = objects
        self.server = RpcServer(ctx.zmq_context, ctx.address())
        self.flusher = ctx.zmq_context.socket(zmq.DEALER)
        self.flusher.setsockopt(zmq.LINGER, 0)
        self.flusher.connect(endpoints.address(ctx.runtime_dir, "flusher"))
        self.coordinator = RpcClient(
            ctx.zmq_context, endpoints.address(ctx.runtime_dir, "coordinator")
        )
        self.partitions: dict[tuple[str, int], PartitionLog] = {}
        self.flush_state: dict[tuple[str, int], FlushState] = {}
        self.pending: list[PendingProduce] = []
        self.loader = PartitionLoader(
            self.config, store, objects, self.coordinator, ctx.run_id, ctx.index
        )
        # Back-pressure and S3 health gating: appends are refused at once, with a retriable
        # error, while the buffers are full or while flushes fail or run slow.
        self.budget = self.config.buffer_bytes // self.config.shards
        self.unflushed = 0
        self.storage_failing: set[tuple[str, int]] = set()
        self.slow_until_ms = 0
        self._label = str(ctx.index)
        metrics.S3_HEALTHY.labels(self._label).set(1)
        self.reads = ReadPath(
            self.config, objects, self.server, self._partition_for, self._label, now_ms
        )

    # -- loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server.socket, zmq.POLLIN)
        poller.register(self.flusher, zmq.POLLIN)
        poller.register(self.reads.wakeup_fd, zmq.POLLIN)
        while not self.ctx.stopping.is_set():
            events = dict(poller.poll(TICK_MS))
            if self.server.socket in events:
                self._drain_requests()
            if self.flusher in events:
                self._drain_flush_replies()
            if self.reads.wakeup_fd in events:
                self._complete_reads()
            self._tick(now_ms())
        self._drain_on_shutdown()

    def _drain_requests(self) -> None:
        while (incoming := self.server.recv(0)) is not None:
            try:
                self._serve(incoming)
            except Exception as exc:
                # A bug or a poison input must cost this request, not every partition's data.
                name = type(incoming.message).__name__
                log.exception("request failed", extra={"request": name})
                if not isinstance(incoming.message, NOTICES):
                    error = f"the shard failed to serve {name}: {type(exc).__name__}"
                    self.server.reply(incoming, messages.ErrorReply(message=error))

    def _complete_reads(self) -> None:
        """Finish the object-store reads that completed; one whose completion raises costs
        its own request (left to time out at the frontend), never the others or the shard."""
        while True:
            try:
                self.reads.on_completions()
                return
            except Exception:
                # on_completions took the failing read off its queue: call it again for the rest
                log.exception("finishing a read failed")

    def _serve(self, incoming: Incoming) -> None:
        message = incoming.message
        if isinstance(message, messages.Ping):
            self.server.reply(incoming, self.ctx.pong())
        elif isinstance(message, messages.Append):
            self._on_append(incoming, message)
        elif isinstance(message, messages.Fetch):
            self.reads.on_fetch(incoming, message)
        elif isinstance(message, messages.ReleaseFetch):
            self.reads.on_release(incoming, message)
        elif isinstance(message, messages.ListOffsets):
            self.reads.on_list_offsets(incoming, message)
        elif isinstance(message, messages.LogStartMoved):
            self._on_log_start_moved(message)
        elif isinstance(message, messages.FlushAll):
            self._on_flush_all(incoming)
        else:
            name = type(message).__name__
            self.server.reply(incoming, messages.ErrorReply(message=f"unexpected {name}"))

    def _drain_flush_replies(self) -> None:
        while self.flusher.poll(0, zmq.POLLIN):
            frames = self.flusher.recv_multipart()
            if len(frames) >= 2:
                reply = messages.decode(frames[1])
                if isinstance(reply, messages.SegmentFlushed):
                    self._on_flushed(reply, REQUEST_ID.unpack(frames[0])[0])

    def _tick(self, now: int) -> None:
        for key, partition in self.partitions.items():
            partition.seal_if_due(now)
            state = self.flush_state[key]
            if state.in_flight >= 0 and now - state.sent_ms >= FLUSH_TIMEOUT_MS:
                log.error(
                    "no answer to a flush; sending it again",
                    extra={
                        "topic": partition.topic,
                        "partition": partition.partition,
                        "base_offset": state.in_flight,
                    },
                )
                state.in_flight = -1
                partition.flush_failed()
                # No answer at all is a failing store too (a paused S3 answers nothing): keep
                # produce refused until a flush of this partition commits.
                self.storage_failing.add(key)
                self._update_gauges()
            if state.in_flight >= 0 and now - state.sent_ms >= self.config.s3_latency_threshold_ms:
                self._flush_is_slow(now)
            if now >= state.retry_at_ms:
                self._start_flush(partition, state, now)
        self._expire_pending(now)
        self.reads.tick(now)

    # -- appends -------------------------------------------------------------------------------

    def _on_append(self, incoming: Incoming, request: messages.Append) -> None:
        now = now_ms()
        results: list[messages.AppendResult] = []
        waits: dict[int, tuple[PartitionLog, int]] = {}
        for index, entry in enumerate(request.entries):
            frame = incoming.bulk[index] if index < len(incoming.bulk) else None
            if frame is None:
                results.append(_error(ErrorCode.invalid_request, "no records for the partition"))
                continue
            try:
                result, wait = self._append(entry, frame, now)
            except Exception as exc:
                # Contained to this partition: the batch was not appended (an append that
                # published moves next_offset in the same step, and nothing after it raises),
                # so the producer may retry.
                log.exception(
                    "append failed", extra={"topic": entry.topic, "partition": entry.partition}
                )
                metrics.BATCHES_REJECTED.labels("internal").inc()
                result, wait = _error(ErrorCode.unknown_server_error, type(exc).__name__), None
            results.append(result)
            if wait is not None:
                waits[index] = wait
        if request.acks == ACKS_ALL and waits:
            self.pending.append(
                PendingProduce(incoming, results, waits, now + max(request.timeout_ms, 0))
            )
        else:
            self.server.reply(incoming, messages.Appended(results=results))
        self._update_gauges()

    def _append(
        self, entry: messages.AppendEntry, frame: zmq.Frame, now: int
    ) -> tuple[messages.AppendResult, tuple[PartitionLog, int] | None]:
        """Validate and append one partition's batch: its result, and what an acks=all
        request waits for (the partition and the batch's last offset), if anything."""
        try:
            partition = self._partition_for(
                entry.topic, entry.topic_id, entry.partition, entry.topic_created_ms
            )
        except StaleTopic as exc:
            return _error(ErrorCode.unknown_topic_or_partition, str(exc)), None
        except (MetadataStoreError, ObjectStoreError, RpcError) as exc:
            # An outage while loading the partition: retriable; the next request loads again.
            # The backend's text (endpoints, bucket) goes to the log, never to the client.
            metrics.BATCHES_REJECTED.labels("storage").inc()
            log.warning(
                "cannot load the partition",
                extra={"topic": entry.topic, "partition": entry.partition, "error": str(exc)},
            )
            return _error(ErrorCode.kafka_storage_error, UNAVAILABLE), None
        partition.codec = entry.codec
        # The topic's segment.bytes, as of this request (it may be altered at any time).
        partition.segment_bytes = entry.segment_bytes or self.config.segment_bytes
        found = validate.split_batches(
            frame.buffer,
            validate.BatchPolicy(
                entry.max_message_bytes,
                entry.allow_zstd,
                entry.log_append_time,
                entry.timestamp_before_max_ms,
                entry.timestamp_after_max_ms,
                self.config.max_decompression_factor,
            ),
            now,
        )
        if isinstance(found, batches.BatchError):
            metrics.BATCHES_REJECTED.labels(found.error_code.name).inc()
            log.warning(
                "batch refused",
                extra={
                    "topic": entry.topic,
                    "partition": entry.partition,
                    "error": found.error_code.name,
                    "reason": found.message,
                },
            )
            return _error(found.error_code, found.message), None
        [batch] = found
        refusal = self._refusal(now, len(batch.data))
        if refusal is not None:
            metrics.BATCHES_REJECTED.labels("storage").inc()
            return _error(ErrorCode.kafka_storage_error, refusal), None
        outcome = partition.append(batch.data, batch.header, now, entry.log_append_time)
        if outcome.error != ErrorCode.none:
            metrics.BATCHES_REJECTED.labels(outcome.error.name).inc()
            return _error(outcome.error, outcome.message), None
        if not outcome.duplicate:
            # Appended: account for it before anything else can fail (the flush subtracts it).
            self.unflushed += len(batch.data)
            metrics.RECORDS_PRODUCED.inc(batch.header.records_count)
            metrics.BYTES_PRODUCED.inc(len(batch.data))
            self._wake_fetches(partition)
        result = messages.AppendResult(
            base_offset=outcome.base_offset,
            log_append_time=outcome.log_append_time,
            log_start_offset=partition.log_start_offset,
        )
        if outcome.last_offset < partition.high_watermark:
            return result, None  # a duplicate of a batch committed already
        return result, (partition, outcome.last_offset)

    def _wake_fetches(self, partition: PartitionLog) -> None:
        """Re-run the fetches parked on ``partition``. Their failure is theirs: the batch is
        appended, and answering its producer with an error would make it send the batch again."""
        try:
            self.reads.appended(partition)
        except Exception:
            log.exception(
                "waking the fetches of a partition failed",
                extra={"topic": partition.topic, "partition": partition.partition},
            )

    def _on_flush_all(self, incoming: Incoming) -> None:
        now = now_ms()
        waits = {}
        for index, partition in enumerate(self.partitions.values()):
            partition.seal(now)
            if partition.next_offset > partition.high_watermark:
                waits[index] = (partition, partition.next_offset - 1)
        pending = PendingProduce(incoming, [], waits, now + FLUSH_ALL_TIMEOUT_MS, flush_all=True)
        if waits:
            self.pending.append(pending)
        else:
            self._answer(pending, timed_out=False)

    def _answer(self, pending: PendingProduce, timed_out: bool) -> None:
        if pending.flush_all:
            error = "not everything was committed in time" if timed_out else None
            reply: messages.Message = messages.FlushedAll(
                partitions=len(pending.waits), error=error
            )
        else:
            reply = messages.Appended(results=pending.results)
        self.server.reply(pending.incoming, reply)

    def _refusal(self, now: int, size: int) -> str | None:
        """Why an append must be refused now (S3 unhealthy, buffers full), or None."""
        if self.storage_failing:
            return "the object store or metadata store is failing; retry later"
        if now < self.slow_until_ms:
            return "the object store is slow; retry later"
        if self.unflushed + size > self.budget:
            return f"the shard's buffers are full ({self.unflushed} bytes unflushed)"
        return None

    def _on_log_start_moved(self, notice: messages.LogStartMoved) -> None:
        """Retention deleted the partition's oldest segments: stop serving them."""
        partition = self.partitions.get((notice.topic, notice.partition))
        if partition is not None and partition.topic_id == notice.topic_id:
            partition.log_start_offset = max(partition.log_start_offset, notice.log_start_offset)
            partition.segments.drop_before(partition.log_start_offset)

    def _partition_for(
        self, topic: str, topic_id: str, index: int, topic_created_ms: int
    ) -> PartitionLog:
        """The partition, loaded on first use (for a write or a read)."""
        key = (topic, index)
        partition = self.partitions.get(key)
        if partition is not None and partition.topic_id == topic_id:
            return partition
        if partition is not None and topic_created_ms < self.flush_state[key].topic_created_ms:
            # A request from a view that has not yet seen the topic re-created: never let it
            # replace (and drop the buffers of) the newer topic.
            raise StaleTopic(f"topic {topic} (id {topic_id}) was deleted")
        if partition is not None:  # the topic was deleted and created again
            self.unflushed -= partition.close()
            self.storage_failing.discard(key)
        partition = self.loader.load(topic, topic_id, index, topic_created_ms)
        self.partitions[key] = partition
        self.flush_state[key] = FlushState(topic_created_ms=topic_created_ms)
        return partition

    def adopt_predecessor(self) -> None:
        """Take over the buffers a crashed predecessor left (at boot, before serving)."""
        for partition, topic_created_ms in self.loader.adopt_predecessor(now_ms()):
            key = (partition.topic, partition.partition)
            self.partitions[key] = partition
            self.flush_state[key] = FlushState(topic_created_ms=topic_created_ms)
            self.unflushed += partition.unflushed_bytes
        self._update_gauges()

    # -- flushes -------------------------------------------------------------------------------

    def _start_flush(self, partition: PartitionLog, state: FlushState, now: int) -> None:
        segment = partition.next_flush()
        if segment is None:
            return
        request = flush_request(partition, segment, state.topic_created_ms)
        state.in_flight = segment.base_offset
        state.sent_ms = now
        state.attempt += 1
        self.flusher.send_multipart([REQUEST_ID.pack(state.attempt), messages.encode(request)])

    def _on_flushed(self, reply: messages.SegmentFlushed, attempt: int) -> None:
        key = (reply.topic, reply.partition)
        partition = self.partitions.get(key)
        state = self.flush_state.get(key)
        if (
            partition is None
            or state is None
            or state.in_flight != reply.base_offset
            or state.attempt != attempt
        ):
            return  # an answer to an attempt given up on, or for a partition reloaded since
        state.in_flight = -1
        if reply.committed:
            segment = partition.sealed[0]
            chunk = segment.whole() if self.reads.segments.capacity >= segment.size else None
            self.unflushed -= partition.flushed(reply.high_watermark)
            if reply.segment is not None:
                self.reads.flushed(partition, chunk, reply.segment)
            state.failures, state.last_error = 0, None
            self.storage_failing.discard(key)
            if reply.upload_ms > self.config.s3_latency_threshold_ms:
                log.warning(
                    "slow upload: refusing produce for a while",
                    extra={"upload_ms": reply.upload_ms},
                )
                self.slow_until_ms = now_ms() + SLOW_PENALTY_MS
            self._update_gauges()
            self._resolve_pending()
            return
        if reply.topic_gone:
            log.info(
                "topic deleted: dropping the partition's buffers",
                extra={"topic": reply.topic, "partition": reply.partition},
            )
            self.unflushed -= partition.close()
            del self.partitions[key], self.flush_state[key]
            self.storage_failing.discard(key)
            self._update_gauges()
            return
        partition.flush_failed()
        if reply.storage_error:
            self.storage_failing.add(key)
            self._update_gauges()
        state.failures += 1
        state.retry_at_ms = now_ms() + min(FLUSH_RETRY_MS * state.failures, 5000)
        if state.last_error != reply.error:
            log.error(
                "flush failed; will retry",
                extra={"topic": reply.topic, "partition": reply.partition, "error": reply.error},
            )
        state.last_error = reply.error

    def _flush_is_slow(self, now: int) -> None:
        """A flush still unanswered after KAFSCALE_S3_LATENCY_THRESHOLD_MS says S3 (or etcd) is
        slow or paused: refuse produce now, not when its answer comes (a paused S3 sends none)."""
        was_slow = now < self.slow_until_ms
        self.slow_until_ms = now + SLOW_PENALTY_MS
        if not was_slow:
            log.warning("a flush is taking too long: refusing produce until flushes complete")
            self._update_gauges()

    def _update_gauges(self) -> None:
        metrics.BUFFER_BYTES.labels(self._label).set(self.unflushed)
        healthy = not self.storage_failing and now_ms() >= self.slow_until_ms
        metrics.S3_HEALTHY.labels(self._label).set(1 if healthy else 0)

    def _resolve_pending(self) -> None:
        still: list[PendingProduce] = []
        for pending in self.pending:
            if all(log.high_watermark > last for log, last in pending.waits.values()):
                self._answer(pending, timed_out=False)
            else:
                still.append(pending)
        self.pending = still

    def _expire_pending(self, now: int) -> None:
        expired = [p for p in self.pending if p.deadline_ms <= now]
        if not expired:
            return
        self.pending = [p for p in self.pending if p.deadline_ms > now]
        for pending in expired:
            if pending.flush_all:
                self._answer(pending, timed_out=True)
                continue
            results = list(pending.results)
            for index, (partition, last) in pending.waits.items():
                if partition.high_watermark <= last:
                    results[index] = _error(
                        ErrorCode.request_timed_out, "the segment was not committed in time"
                    )
            self.server.reply(pending.incoming, messages.Appended(results=results))

    def _drain_on_shutdown(self) -> None:
        """Seal everything and wait (bounded) for the flusher to commit it."""
        deadline = time.monotonic() + 25
        for partition in self.partitions.values():
            partition.seal(now_ms())
        while time.monotonic() < deadline and any(p.sealed for p in self.partitions.values()):
            if self.flusher.poll(TICK_MS, zmq.POLLIN):
                self._drain_flush_replies()
            self._tick(now_ms())
        for partition in self.partitions.values():
            if partition.sealed:
                log.error(
                    "stopping with unflushed data",
                    extra={
                        "topic": partition.topic,
                        "partition": partition.partition,
                        "bytes": partition.unflushed_bytes,
                    },
                )
            partition.close()

    def close(self) -> None:
        self.reads.close()
        self.server.close()
        self.flusher.close(linger=0)
        self.coordinator.close()


def flush_request(
    partition: PartitionLog, segment: BufferedSegment, topic_created_ms: int
) -> messages.FlushSegment:
    """What the flusher gets for a sealed buffer: everything in it comes from the buffer as
    sealed, so a successor that adopted the buffer asks for the very same segment."""
    return messages.FlushSegment(
        buffer=segment.buffer.name,
        generation=segment.buffer.generation,
        size=segment.size,
        topic=partition.topic,
        topic_id=partition.topic_id,
        partition=partition.partition,
        base_offset=segment.base_offset,
        last_offset=segment.last_offset,
        records=segment.records,
        max_timestamp=segment.max_timestamp,
        created_ms=segment.sealed_ms,
        codec=segment.codec,
        producers=segment.producers,
        topic_created_ms=topic_created_ms,
    )


def _error(code: ErrorCode, message: str | None) -> messages.AppendResult:
    return messages.AppendResult(error_code=int(code), message=message)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def run(ctx: ChildContext) -> None:
    store = open_metadata_store(ctx.config)
    objects = MeteredObjectStore(open_object_store(ctx.config))
    shard = Shard(ctx, store, objects)
    try:
        shard.adopt_predecessor()  # before ready: no append is served before it is done
        ctx.ready()
        shard.run()
    finally:
        shard.close()
        store.close()
        objects.close()
