"""The flusher process: turns sealed partition buffers into ``.kfs``/``.index`` objects in S3.

Shards send ``FlushSegment``; a pool of worker threads each reads the sealed buffer from shared
memory, compresses the batches that arrived uncompressed with the partition's codec, builds the
segment and index (``kafscale.storage.segment``), uploads both in parallel with put-if-absent,
and asks the coordinator to commit. Only then does the shard hear ``committed``. Many partitions
flush at once. A shard sends one flush per partition at a time, but re-sends one unanswered for
its flush timeout (10 s), which is shorter than an S3 call may take (twice
``KAFSCALE_S3_TIMEOUT_MS``): the earlier job may still be here. Both build the same bytes from the
same buffer; a job whose buffer the shard has freed meanwhile is refused, and any failure of a
job is answered, never left without a reply.

Uploads are deterministic (the segment's created time comes from the shard's seal), so a retry
after a lost reply writes the same bytes, and a key that exists with the same bytes (or the same
records) is our own earlier attempt, or the same buffer flushed again by a restarted shard. A key
that exists with other bytes is judged by the metadata (``kafscale.flusher.collision``): a
committed object is never deleted or rewritten; only a deleted topic's leftover that no record
references is replaced. Anything else is refused loudly and never overwritten.

A backend that fails (S3, the metadata store, the coordinator answering ``ErrorReply`` because
its store is down) is reported as a storage error: the shard refuses produce meanwhile and
retries the flush.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time

import msgspec
import zmq

from kafscale import metrics
from kafscale.flusher import collision
from kafscale.flusher.collision import Verdict
from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import Incoming, RpcClient, RpcError, RpcServer
from kafscale.ipc.shm import PartitionBuffer
from kafscale.metadata import open_metadata_store
from kafscale.metadata import records as metadata_records
from kafscale.metadata.records import Keys, SegmentRecord
from kafscale.metadata.store import MetadataStore, MetadataStoreError
from kafscale.protocol import records
from kafscale.storage import open_object_store
from kafscale.storage import segment as segments
from kafscale.storage.metered import MeteredObjectStore
from kafscale.storage.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)

WORKERS = 8
COMMIT_TIMEOUT_MS = 10_000


class FlushError(Exception):
    """The flush could not complete; the shard keeps the buffer and retries."""


class Collision(FlushError):
    """A segment key holds other bytes than ours (and is not a deleted topic's leftover)."""


class TopicGone(FlushError):
    """The topic was deleted while its segment was being flushed."""


class CoordinatorFailed(FlushError):
    """The coordinator could not commit (its metadata store is unreachable): retry later."""


class Flusher:
    def __init__(self, ctx: ChildContext, objects: ObjectStore, store: MetadataStore) -> None:
        self.ctx = ctx
        self.objects = objects
        self.store = store  # read only: the records that decide what a collision is
        self.namespace = ctx.config.s3_namespace
        self.keys = Keys(self.namespace)
        self.coordinator_address = endpoints.address(ctx.runtime_dir, "coordinator")
        self._local = threading.local()
        self._uploads = concurrent.futures.ThreadPoolExecutor(WORKERS * 2, "upload")

    def flush(self, job: messages.FlushSegment) -> messages.SegmentFlushed:
        started = time.monotonic()
        try:
            high_watermark, upload_ms, segment = self._flush(job)
        except (ObjectStoreError, MetadataStoreError, RpcError, CoordinatorFailed) as exc:
            metrics.FLUSH_ERRORS.labels("storage").inc()
            return _failed(job, str(exc), storage_error=True)
        except TopicGone as exc:
            failed = _failed(job, str(exc), storage_error=False)
            return msgspec.structs.replace(failed, topic_gone=True)
        except FlushError as exc:
            metrics.FLUSH_ERRORS.labels("refused").inc()
            return _failed(job, str(exc), storage_error=False)
        except Exception as exc:
            # A bug, or a buffer gone from shared memory: the shard must still hear of it (it
            # retries), and the worker must answer, or the flusher's shutdown waits for it.
            log.exception("flush failed", extra={"topic": job.topic, "partition": job.partition})
            metrics.FLUSH_ERRORS.labels("internal").inc()
            return _failed(job, f"{type(exc).__name__}: {exc}", storage_error=False)
        metrics.FLUSHES.inc()
        metrics.FLUSH_BYTES.inc(job.size)
        metrics.FLUSH_SECONDS.observe(time.monotonic() - started)
        return messages.SegmentFlushed(
            topic=job.topic,
            partition=job.partition,
            base_offset=job.base_offset,
            committed=True,
            high_watermark=high_watermark,
            upload_ms=upload_ms,
            segment=segment,
        )

    def _flush(self, job: messages.FlushSegment) -> tuple[int, int, SegmentRecord]:
        """The committed high watermark, how long the uploads took (ms), the segment's record."""
        data = self._read_buffer(job)
        batches = [records.compress_batch(batch, job.codec) for batch in _split(data)]
        kfs, index = segments.build_segment(batches, flags=job.codec, created_ms=job.created_ms)
        kfs_key = segments.segment_key(self.namespace, job.topic, job.partition, job.base_offset)
        index_key = segments.index_key(self.namespace, job.topic, job.partition, job.base_offset)
        uploaded = time.monotonic()
        kfs_upload = self._uploads.submit(self._put_segment, job, kfs_key, kfs)
        index_upload = self._uploads.submit(self._put, index_key, index)
        created_ms = kfs_upload.result()
        index_size = len(index)
        try:
            index_upload.result()
        except Collision:
            index_size = self._settle_index(job, index_key, index)
        upload_ms = int((time.monotonic() - uploaded) * 1000)
        segment = SegmentRecord(
            base_offset=job.base_offset,
            last_offset=job.last_offset,
            size=len(kfs),
            index_size=index_size,
            records=job.records,
            max_timestamp=job.max_timestamp,
            created_ms=created_ms,
        )
        reply = (
            self._coordinator()
            .call(
                messages.CommitSegment(
                    topic=job.topic,
                    topic_id=job.topic_id,
                    partition=job.partition,
                    segment=segment,
                    producers=job.producers,
                ),
                timeout_ms=COMMIT_TIMEOUT_MS,
            )
            .message
        )
        if isinstance(reply, messages.ErrorReply):
            raise CoordinatorFailed(f"the coordinator could not commit: {reply.message}")
        if not isinstance(reply, messages.SegmentCommitted):
            raise FlushError(f"unexpected reply from the coordinator: {reply!r}")
        if not reply.committed and reply.high_watermark == -1:
            # The topic was deleted (or re-created) meanwhile: take back what we uploaded, so a
            # new topic of the same name never meets it.
            for key, data in ((kfs_key, kfs), (index_key, index)):
                self._delete_if_ours(key, data)
            raise TopicGone(reply.error or "topic deleted")
        if reply.committed or reply.high_watermark > job.last_offset:
            return reply.high_watermark, upload_ms, segment  # committed now or by an earlier try
        raise FlushError(f"commit refused: {reply.error}")

    def _read_buffer(self, job: messages.FlushSegment) -> bytes:
        buffer = PartitionBuffer.attach(job.buffer)
        try:
            data = buffer.read(0, job.size, job.generation)
        finally:
            buffer.close()
        if data is None:
            raise FlushError(f"buffer {job.buffer} was reused before it was flushed")
        return data

    def _put(self, key: str, data: bytes) -> bool:
        """Put-if-absent; True if created, False if the key holds these very bytes already.
        Raises Collision if it holds other bytes."""
        started = time.monotonic()
        try:
            created = self.objects.put_if_absent(key, data)
        except ObjectStoreError:
            metrics.S3_ERRORS.labels("put").inc()
            raise
        metrics.S3_PUT_SECONDS.observe(time.monotonic() - started)
        if created:
            return True
        if self.objects.get(key) == data:
            return False
        raise Collision(f"{key} exists with different bytes")

    def _put_segment(self, job: messages.FlushSegment, key: str, kfs: bytes) -> int:
        """Upload the segment; the created time of the segment now under ``key`` (ours, or an
        earlier upload of the same records). Raises Collision if the key holds another one."""
        for _ in range(2):  # a replaced leftover can be raced by another writer once
            try:
                self._put(key, kfs)
                return job.created_ms
            except Collision:
                existing = self.objects.get(key)
            judgement = collision.judge_segment(
                existing, kfs, self._committed(job), self._topic_created_ms(job)
            )
            if judgement.verdict is Verdict.OURS:
                log.info("segment already uploaded", extra={"key": key, "reason": judgement.reason})
                return segments.parse_segment(existing, verify=False).created_ms
            if judgement.verdict is Verdict.CONFLICT:
                log.error(
                    "a different segment already exists under the key; not overwriting",
                    extra={"key": key, "reason": judgement.reason},
                )
                raise Collision(f"{key} holds {judgement.reason}")
            log.warning(
                "replacing an object under a segment key",
                extra={"key": key, "reason": judgement.reason},
            )
            self.objects.delete(key)
        raise Collision(f"{key} was written by another writer while we replaced a leftover")

    def _settle_index(self, job: messages.FlushSegment, key: str, index: bytes) -> int:
        """Our segment is in place and the index under its key differs: a leftover, replaced
        unless a committed record references it (then it stays: an index is an accelerator,
        readers check what it points at). The size of the index now under ``key``."""
        committed = self._committed(job)
        if committed is not None and not collision.may_replace_index(committed):
            log.warning("the committed index differs from ours; keeping it", extra={"key": key})
            return committed.index_size
        log.warning("replacing a leftover index", extra={"key": key})
        self.objects.delete(key)
        self._put(key, index)
        return len(index)

    def _committed(self, job: messages.FlushSegment) -> SegmentRecord | None:
        kv = self.store.get(self.keys.segment(job.topic, job.partition, job.base_offset))
        return metadata_records.decode_segment(kv.value) if kv is not None else None

    def _topic_created_ms(self, job: messages.FlushSegment) -> int:
        """The creation time of the job's topic as its metadata record has it (0 if the topic
        is gone or was re-created: then it is not ours to judge)."""
        kv = self.store.get(self.keys.topic(job.topic))
        if kv is None:
            return 0
        topic = metadata_records.decode_topic(kv.value)
        return topic.created_ms if topic.topic_id == job.topic_id else 0

    def _delete_if_ours(self, key: str, data: bytes) -> None:
        try:
            if self.objects.get(key) == data:
                self.objects.delete(key)
        except ObjectNotFound:
            pass

    def _coordinator(self) -> RpcClient:
        """One ZeroMQ socket per worker thread (sockets are not thread-safe)."""
        client: RpcClient | None = getattr(self._local, "coordinator", None)
        if client is None:
            client = RpcClient(self.ctx.zmq_context, self.coordinator_address)
            self._local.coordinator = client
        return client

    def close(self) -> None:
        self._uploads.shutdown(wait=True)


def _failed(job: messages.FlushSegment, error: str, storage_error: bool) -> messages.SegmentFlushed:
    return messages.SegmentFlushed(
        topic=job.topic,
        partition=job.partition,
        base_offset=job.base_offset,
        committed=False,
        high_watermark=-1,
        error=error,
        storage_error=storage_error,
    )


def _split(data: bytes) -> list[memoryview]:
    """The batches of a sealed buffer. The shard validated each one, so a length that does not
    frame (shared memory damaged under us) is a failed flush the shard retries, never a loop."""
    view = memoryview(data)
    out, pos = [], 0
    while pos < len(view):
        if len(view) - pos < records.HEADER.size:
            raise FlushError(f"the buffer ends inside a batch header at position {pos}")
        size = records.read_header(view, pos).size
        if size < records.HEADER.size or pos + size > len(view):
            raise FlushError(f"the buffer's batch at position {pos} does not frame ({size} bytes)")
        out.append(view[pos : pos + size])
        pos += size
    return out


def run(ctx: ChildContext) -> None:
    objects = MeteredObjectStore(open_object_store(ctx.config))
    objects.check()
    store = open_metadata_store(ctx.config)
    flusher = Flusher(ctx, objects, store)
    server = RpcServer(ctx.zmq_context, ctx.address())
    done: queue.SimpleQueue[tuple[Incoming, messages.Message]] = queue.SimpleQueue()
    wake_pull = ctx.zmq_context.socket(zmq.PULL)
    wake_pull.bind(f"inproc://flusher-done-{id(flusher)}")
    workers = concurrent.futures.ThreadPoolExecutor(WORKERS, "flush")

    def work(incoming: Incoming, job: messages.FlushSegment) -> None:
        done.put((incoming, flusher.flush(job)))
        wake = ctx.zmq_context.socket(zmq.PUSH)
        wake.connect(f"inproc://flusher-done-{id(flusher)}")
        wake.send(b"")
        wake.close()

    poller = zmq.Poller()
    poller.register(server.socket, zmq.POLLIN)
    poller.register(wake_pull, zmq.POLLIN)
    log.info("flusher up", extra={"objects": objects.description})
    ctx.ready()
    in_flight = 0
    try:
        while not ctx.stopping.is_set() or in_flight:
            events = dict(poller.poll(100))
            if wake_pull in events:
                while wake_pull.poll(0):
                    wake_pull.recv()
            while not done.empty():
                finished, reply = done.get()
                server.reply(finished, reply)
                in_flight -= 1
            if server.socket in events:
                while (incoming := server.recv(0)) is not None:
                    message = incoming.message
                    if isinstance(message, messages.FlushSegment):
                        in_flight += 1
                        workers.submit(work, incoming, message)
                    elif isinstance(message, messages.Ping):
                        server.reply(incoming, ctx.pong())
                    else:
                        server.reply(
                            incoming,
                            messages.ErrorReply(message=f"unexpected {type(message).__name__}"),
                        )
    finally:
        workers.shutdown(wait=True)
        flusher.close()
        server.close()
        wake_pull.close(linger=0)
        store.close()
        objects.close()
