"""The flusher process: turns sealed partition buffers into ``.kfs``/``.index`` objects in S3.

Shards send ``FlushSegment``; a pool of worker threads each reads the sealed buffer from shared
memory, compresses the batches that arrived uncompressed with the partition's codec, builds the
segment and index (``kafscale.storage.segment``), uploads both in parallel with put-if-absent,
and asks the coordinator to commit. Only then does the shard hear ``committed``. Many partitions
flush at once; one partition never has two flushes in flight (the shard sees to that).

Uploads are deterministic (the segment's created time comes from the shard's seal), so a retry
after a lost reply writes the same bytes, and a key that exists with the same bytes is our own
earlier attempt. A key that exists with other bytes is refused loudly and never overwritten.
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
from kafscale.ipc import endpoints, messages
from kafscale.ipc.rpc import Incoming, RpcClient, RpcError, RpcServer
from kafscale.ipc.shm import PartitionBuffer
from kafscale.metadata.records import SegmentRecord
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


class Flusher:
    def __init__(self, ctx: ChildContext, objects: ObjectStore) -> None:
        self.ctx = ctx
        self.objects = objects
        self.namespace = ctx.config.s3_namespace
        self.coordinator_address = endpoints.address(ctx.runtime_dir, "coordinator")
        self._local = threading.local()
        self._uploads = concurrent.futures.ThreadPoolExecutor(WORKERS * 2, "upload")

    def flush(self, job: messages.FlushSegment) -> messages.SegmentFlushed:
        started = time.monotonic()
        try:
            high_watermark, upload_ms, segment = self._flush(job)
        except (ObjectStoreError, RpcError) as exc:
            metrics.FLUSH_ERRORS.labels("storage").inc()
            return _failed(job, str(exc), storage_error=True)
        except TopicGone as exc:
            failed = _failed(job, str(exc), storage_error=False)
            return msgspec.structs.replace(failed, topic_gone=True)
        except FlushError as exc:
            metrics.FLUSH_ERRORS.labels("refused").inc()
            return _failed(job, str(exc), storage_error=False)
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
        kfs_upload = self._uploads.submit(self._put, kfs_key, kfs)
        index_upload = self._uploads.submit(self._put, index_key, index)
        kfs_upload.result()
        try:
            index_upload.result()
        except Collision:
            # Our segment is in place, so an index under its key that differs is a leftover.
            self.objects.delete(index_key)
            self._put(index_key, index)
        upload_ms = int((time.monotonic() - uploaded) * 1000)
        segment = SegmentRecord(
            base_offset=job.base_offset,
            last_offset=job.last_offset,
            size=len(kfs),
            index_size=len(index),
            records=job.records,
            max_timestamp=job.max_timestamp,
            created_ms=job.created_ms,
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

    def _put(self, key: str, data: bytes) -> None:
        started = time.monotonic()
        try:
            created = self.objects.put_if_absent(key, data)
        except ObjectStoreError:
            metrics.S3_ERRORS.labels("put").inc()
            raise
        metrics.S3_PUT_SECONDS.observe(time.monotonic() - started)
        if created:
            return
        existing = self.objects.get(key)
        if existing != data and _leftover(existing, data):
            log.warning(
                "removing a leftover of a deleted topic under a segment key", extra={"key": key}
            )
            self.objects.delete(key)
            if self.objects.put_if_absent(key, data):
                return
            existing = self.objects.get(key)
        if existing != data:
            log.error(
                "a different object already exists under a segment key; not overwriting",
                extra={"key": key},
            )
            raise Collision(f"{key} exists with different bytes")

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


def _leftover(existing: bytes, ours: bytes) -> bool:
    """Whether ``existing`` (under our segment key, with other bytes) is a segment sealed before
    the one we are writing: a deleted topic's upload that raced its deletion. Only segments are
    judged; an index follows its segment."""
    try:
        theirs = segments.parse_segment(existing, verify=False)
        mine = segments.parse_segment(ours, verify=False)
    except segments.CorruptSegment:
        return False
    return theirs.created_ms < mine.created_ms


def _split(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    out, pos = [], 0
    while pos < len(view):
        size = records.read_header(view, pos).size
        out.append(view[pos : pos + size])
        pos += size
    return out


def run(ctx: ChildContext) -> None:
    objects = MeteredObjectStore(open_object_store(ctx.config))
    objects.check()
    flusher = Flusher(ctx, objects)
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
        objects.close()
