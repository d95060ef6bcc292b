"""A shard worker: owns a fixed subset of partitions and their shared-memory append buffers.

The frontend routes each partition to its shard (``kafscale.ipc.routing``). For each Append the
shard validates the batch (``kafscale.protocol.records``), checks idempotence and assigns offsets
(``PartitionLog``), and answers: at once for acks=0/1, once the partitions' commits passed the
batch for acks=all. The flusher decides when data goes (docs/design/write-path.md, sections 4-5):
the shard tells it what is pending (``ShardPending``), hands over every sealed buffer at each
``Cut`` and learns each buffer's fate from ``ObjectCommitted``; the bookkeeping of which cycle
holds which buffer and when to report is ``kafscale.shards.flushes`` (pure), carried out by
``kafscale.shards.cycles``.

A partition is loaded on first use from its committed state (``kafscale.shards.loading``). A
shard that restarts after a crash first adopts the buffers its predecessor left in shared memory
(verified, reconciled with the committed state: ``kafscale.shards.adoption``), before it reports
ready: acks=1 data survives the crash, offsets continue after it, and the adopted buffers are
offered at the first cut like any sealed buffer (one an earlier cycle committed already is
answered committed).

Containment: an exception while serving one request is logged and answered with an error (for
an Append, per partition), and the loop goes on; so does one while finishing a read that
completed on a reader thread (that request is left to time out). Neither takes the shard down.
"""

from __future__ import annotations

import contextlib
import logging
import time

import zmq

from kafscale import metrics
from kafscale.ipc import cleaning, endpoints, messages, write_path
from kafscale.ipc.rpc import REQUEST_ID, Incoming, RpcClient, RpcError, RpcServer
from kafscale.metadata import open_metadata_store
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.protocol import records as batches
from kafscale.protocol import validate
from kafscale.protocol.errors import ErrorCode
from kafscale.shards.admission import Admission
from kafscale.shards.cycles import CycleLink
from kafscale.shards.flushes import Key
from kafscale.shards.leases import NotLeader, ShardLeases
from kafscale.shards.loading import PartitionLoader
from kafscale.shards.partition import PartitionLog, StaleTopic
from kafscale.shards.reader import ReadPath
from kafscale.shards.waiting import Answers, Waiters, Waiting
from kafscale.storage import open_object_store
from kafscale.storage.metered import MeteredObjectStore
from kafscale.storage.objects import ObjectStore, ObjectStoreError
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)

TICK_MS = 20
GAUGES_MS = 200  # how often the shard's gauges are set
FLUSH_ALL_TIMEOUT_MS = 60_000
DRAIN_S = 25  # how long a stopping shard waits for its data to be committed
ACKS_ALL = -1
UNAVAILABLE = "cannot load the partition: the object store or metadata store is unavailable"
# Nobody waits on an answer to these.
NOTICES = (
    messages.LogStartMoved,
    write_path.SealPartition,
    messages.ReleaseFetch,
    write_path.ObjectCommitted,
    write_path.SegmentsCompacted,
    cleaning.SegmentsCleaned,
)


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
        self.partitions: dict[Key, PartitionLog] = {}
        self.waiters = Waiters()  # acks=all requests and flushes waiting for commits
        # Which partitions are this broker's, at which epoch (its own view of the leader keys).
        self.leases = ShardLeases(
            store, self.config.s3_namespace, self.config.broker_id, ctx.lease_id
        )
        self.leases.start()
        self.notices = ctx.zmq_context.socket(zmq.DEALER)  # PartitionSealed to the coordinator
        self.notices.setsockopt(zmq.LINGER, 0)
        self.notices.connect(endpoints.address(ctx.runtime_dir, "coordinator"))
        self.loader = PartitionLoader(
            self.config, store, objects, self.coordinator, ctx.run_id, ctx.index
        )
        # Back-pressure and health: appends are refused while the buffers are full or while
        # cycles fail or run slow.
        self.admission = Admission(self.config.buffer_bytes // self.config.shards)
        self._label = str(ctx.index)
        self._gauges_at = 0  # when the gauges are set next (now_ms)
        metrics.S3_HEALTHY.labels(self._label).set(1)
        self.reads = ReadPath(
            self.config, objects, self.server, self._partition_for, self._label, now_ms, store
        )
        self.cycles = CycleLink(
            ctx.index,
            self.config,
            self.flusher,
            self.partitions,
            self.reads,
            self.admission,
            self.waiters.since_ms,
        )

    # -- loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server.socket, zmq.POLLIN)
        poller.register(self.reads.wakeup_fd, zmq.POLLIN)
        while not self.ctx.stopping.is_set():
            events = dict(poller.poll(TICK_MS))
            if self.server.socket in events:
                self._drain_requests()
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
        elif isinstance(message, write_path.Cut):
            self.server.reply(incoming, self.cycles.on_cut(message, now_ms()))
        elif isinstance(message, write_path.ObjectCommitted):
            self.cycles.on_committed(message, now_ms())
            self._send(self.waiters.committed())
        elif isinstance(message, write_path.SegmentsCompacted):
            self.cycles.on_compacted(message)
        elif isinstance(message, cleaning.SegmentsCleaned):
            self._on_cleaned(message)
        elif isinstance(message, messages.FlushAll):
            self._on_flush_all(incoming)
        elif isinstance(message, write_path.SealPartition):
            self._on_seal(message)
        else:
            name = type(message).__name__
            self.server.reply(incoming, messages.ErrorReply(message=f"unexpected {name}"))

    def _tick(self, now: int) -> None:
        if self.leases.changed():
            self._follow_leaders()
        if self.leases.sealing:
            self._progress_seals(now)
        self.cycles.tick(now)
        self._send(self.waiters.expire(now))
        self.reads.tick(now)
        if now >= self._gauges_at:  # the loop ticks after every batch of events
            self._gauges_at = now + GAUGES_MS
            metrics.BUFFER_BYTES.labels(self._label).set(self.admission.unflushed)
            metrics.S3_HEALTHY.labels(self._label).set(1 if self.admission.healthy(now) else 0)
            self.reads.publish()

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
            deadline = now + max(request.timeout_ms, 0)
            self._send(self.waiters.add(Waiting(incoming, results, waits, deadline, now)))
            self.cycles.urgent(now)
        else:
            self.server.reply(incoming, messages.Appended(results=results))

    def _append(
        self, entry: messages.AppendEntry, frame: zmq.Frame, now: int
    ) -> tuple[messages.AppendResult, tuple[PartitionLog, int] | None]:
        """Validate and append one partition's batch: its result, and what an acks=all
        request waits for (the partition and the batch's last offset), if anything."""
        try:
            self.leases.require_writable(entry.topic, entry.partition)
            partition = self._partition_for(
                entry.topic, entry.topic_id, entry.partition, entry.topic_created_ms
            )
        except NotLeader as exc:
            metrics.BATCHES_REJECTED.labels("not_leader").inc()
            return _error(ErrorCode.not_leader_or_follower, str(exc)), None
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
                entry.compacted,
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
        refusal = self.admission.refusal(now, len(batch.data))
        if refusal is not None:
            metrics.BATCHES_REJECTED.labels("storage").inc()
            return _error(ErrorCode.kafka_storage_error, refusal), None
        outcome = partition.append(batch.data, batch.header, now, entry.log_append_time)
        if outcome.error != ErrorCode.none:
            metrics.BATCHES_REJECTED.labels(outcome.error.name).inc()
            return _error(outcome.error, outcome.message), None
        if not outcome.duplicate:
            # Appended: account for it before anything else can fail (the commit subtracts it).
            self.admission.unflushed += len(batch.data)
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
        """Answered once everything appended so far is committed (the next cut is hurried)."""
        now = now_ms()
        waits = {
            index: (partition, partition.next_offset - 1)
            for index, partition in enumerate(self.partitions.values())
            if partition.next_offset > partition.high_watermark
        }
        deadline = now + FLUSH_ALL_TIMEOUT_MS
        self._send(self.waiters.add(Waiting(incoming, [], waits, deadline, now, flush_all=True)))
        if waits:
            self.cycles.urgent(now)

    def _send(self, answers: Answers) -> None:
        for incoming, reply in answers:
            self.server.reply(incoming, reply)

    def _on_log_start_moved(self, notice: messages.LogStartMoved) -> None:
        """Retention deleted the partition's oldest segments: stop serving them."""
        partition = self.partitions.get((notice.topic, notice.partition))
        if partition is not None and partition.topic_id == notice.topic_id:
            partition.log_start_offset = max(partition.log_start_offset, notice.log_start_offset)
            partition.segments.drop_before(partition.log_start_offset)

    def _on_cleaned(self, notice: cleaning.SegmentsCleaned) -> None:
        """The log cleaner replaced segments of the partition: serve the new ones."""
        partition = self.partitions.get((notice.topic, notice.partition))
        if partition is not None and partition.topic_id == notice.topic_id:
            self.reads.cleaned(partition, notice.segments)

    def _partition_for(
        self, topic: str, topic_id: str, index: int, topic_created_ms: int
    ) -> PartitionLog:
        """The partition, loaded on first use (for a write or a read) at the leader epoch this
        broker owns it at; ``NotLeader`` if it does not."""
        epoch = self.leases.require(topic, index)
        key = (topic, index)
        partition = self.partitions.get(key)
        if partition is not None and partition.leader_epoch != epoch:
            self._close(key, f"claimed again at leader epoch {epoch}")
            partition = None
        if partition is not None and partition.topic_id == topic_id:
            return partition
        if partition is not None and topic_created_ms < partition.topic_created_ms:
            # A request from a view that has not yet seen the topic re-created: never let it
            # replace (and drop the buffers of) the newer topic.
            raise StaleTopic(f"topic {topic} (id {topic_id}) was deleted")
        if partition is not None:  # the topic was deleted and created again
            self.cycles.drop(key)
        partition = self.loader.load(topic, topic_id, index, topic_created_ms)
        if partition.leader_epoch != epoch:  # claimed again since the view saw our key
            partition.close()
            raise NotLeader(f"{topic}/{index} is at leader epoch {partition.leader_epoch} now")
        self.partitions[key] = partition
        return partition

    # -- ownership (kafscale.shards.leases) ----------------------------------------------------

    def _follow_leaders(self) -> None:
        """Close every loaded partition the leader keys no longer show as ours at its epoch."""
        loaded = {key: partition.leader_epoch for key, partition in self.partitions.items()}
        for key in self.leases.lost(loaded):
            self._close(key, "this broker no longer owns it at the epoch it was loaded at")
        self.leases.forget(
            [key for key, epoch in self.leases.sealing.items() if self.leases.epoch(*key) != epoch]
        )

    def _close(self, key: Key, reason: str) -> None:
        """Drop the partition at once: its buffers (never acknowledged: acks=all waits for a
        commit that can no longer happen) and its waiters, answered NOT_LEADER_OR_FOLLOWER."""
        partition = self.partitions.get(key)
        if partition is None:
            return
        lost = partition.next_offset - partition.high_watermark
        log.warning(
            "dropping a partition",
            extra={"topic": key[0], "partition": key[1], "reason": reason, "uncommitted": lost},
        )
        self._send(self.waiters.lost(partition, _error(ErrorCode.not_leader_or_follower, reason)))
        self.cycles.drop(key)

    def _on_seal(self, notice: write_path.SealPartition) -> None:
        key = (notice.topic, notice.partition)
        if self.leases.epoch(*key) != notice.leader_epoch:
            self._sealed(key, notice.leader_epoch)  # not ours at that epoch: nothing to commit
            return
        if key not in self.leases.sealing:
            log.info("handing a partition over", extra={"topic": key[0], "partition": key[1]})
        self.leases.sealing[key] = notice.leader_epoch

    def _progress_seals(self, now: int) -> None:
        """Unload each partition being handed over once everything it took is committed."""
        for key, epoch in list(self.leases.sealing.items()):
            partition = self.partitions.get(key)
            if partition is not None and partition.leader_epoch == epoch:
                if partition.next_offset > partition.high_watermark:
                    self.cycles.urgent(now)
                    continue
                self.cycles.drop(key)
            self._sealed(key, epoch)

    def _sealed(self, key: Key, epoch: int) -> None:
        notice = write_path.PartitionSealed(key[0], key[1], epoch)
        with contextlib.suppress(zmq.Again):  # the coordinator asks again until answered
            self.notices.send_multipart(
                [REQUEST_ID.pack(0), messages.encode(notice)], flags=zmq.NOBLOCK
            )

    def adopt_predecessor(self) -> None:
        """Take over the buffers a crashed predecessor left (at boot, before serving)."""
        for partition in self.loader.adopt_predecessor(now_ms()):
            self.partitions[(partition.topic, partition.partition)] = partition
            self.admission.unflushed += partition.unflushed_bytes

    def _drain_on_shutdown(self) -> None:
        """Refuse appends and wait (bounded) for the flusher to commit everything."""
        self.admission.stopping = True
        started, deadline = now_ms(), time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and any(
            p.next_offset > p.high_watermark for p in self.partitions.values()
        ):
            self.cycles.urgent(started)
            if self.server.socket.poll(TICK_MS, zmq.POLLIN):
                self._drain_requests()
            self._tick(now_ms())
        for partition in self.partitions.values():
            if partition.next_offset > partition.high_watermark:
                log.error(
                    "stopping with uncommitted data",
                    extra={
                        "topic": partition.topic,
                        "partition": partition.partition,
                        "bytes": partition.unflushed_bytes,
                    },
                )
            partition.close()

    def close(self) -> None:
        self.leases.stop()
        self.notices.close(linger=0)
        self.reads.close()
        self.server.close()
        self.flusher.close(linger=0)
        self.coordinator.close()


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
