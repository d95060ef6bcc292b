"""The flusher process: cuts flush cycles, uploads one write-ahead object per cycle, commits.

The decisions are the pure cycle state machine's (``kafscale.flusher.cycle``); this module does
its I/O (docs/design/write-path.md, sections 4 and 5):

- a ROUTER (``ctx.address()``) takes the shards' ``ShardPending`` notices and the supervisor's
  pings; one DEALER per shard sends it ``Cut`` (answered ``CutEntries``) and the
  ``ObjectCommitted`` / ``SegmentsCompacted`` notices. A shard that is not connected gets no cut
  (its successor reports when it is up) and misses the notice (it times the cycle out);
- a pool of ``max_uploads_in_flight`` threads builds and uploads the objects
  (``kafscale.flusher.objects``): the next object fills while earlier ones upload;
- ONE commit thread asks the coordinator to commit (``CommitObject``), so commits reach it in
  cycle order, then hands each committed chunk to the compactor.

Every worker reports back through a queue and wakes the loop with an eventfd; all sockets but
the commit thread's coordinator client belong to the loop thread. Object keys are
``{ns}/!wal/{broker}/{token}/{seq}.wal`` with a token drawn at start, so no key repeats across
incarnations; cycle numbers start at the start time (ms), so a shard never mistakes a cycle of
this flusher for one of its predecessor's. On stop, no new cycle is cut; those in flight finish
and are answered.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec
import zmq

from kafscale import metrics
from kafscale.cleaner.worker import Cleaner
from kafscale.flusher import commits, cycle, objects, recovery
from kafscale.flusher.compaction import Compactor
from kafscale.flusher.cycle import Answer, Build, Commit, Cycles, Instruction, Limits, SendCut
from kafscale.flusher.objects import BuiltObject, KeyTaken
from kafscale.ipc import endpoints, messages, write_path
from kafscale.ipc.cleaning import CommitCleaning
from kafscale.ipc.rpc import REQUEST_ID, RpcClient, RpcError, RpcServer
from kafscale.ipc.write_path import EntryResult, SegmentCommitted
from kafscale.metadata import open_metadata_store
from kafscale.metadata.owned import OwnedPartitions
from kafscale.metadata.records import SegmentRecord
from kafscale.storage import open_object_store, wal
from kafscale.storage.metered import MeteredObjectStore
from kafscale.storage.objects import ObjectStore, ObjectStoreError
from kafscale.supervisor.child import ChildContext

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_MS = 10_000
IDLE_POLL_MS = 100


def now_ms() -> int:
    return time.time_ns() // 1_000_000  # the shards' clock (ShardPending.oldest_ms)


@dataclass(frozen=True, slots=True)
class Uploaded:
    cycle: int
    built: BuiltObject | None
    error: str | None = None
    storage_error: bool = False


@dataclass(frozen=True, slots=True)
class Committed:
    cycle: int
    results: list[EntryResult]


@dataclass(frozen=True, slots=True)
class Notify:
    shard: int
    message: messages.Message


Done = Uploaded | Committed | Notify


class ChunkSink(Protocol):
    """Where committed chunks go (the compactor, ``kafscale.flusher.compaction``)."""

    def committed(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        segment_bytes: int,
        record: SegmentRecord,
        data: bytes | memoryview,
    ) -> None: ...


class Flusher:
    def __init__(self, ctx: ChildContext, objects_: ObjectStore) -> None:
        config = ctx.config
        self.ctx = ctx
        self.objects = objects_
        self.cycles = Cycles(
            Limits(
                flush_interval_ms=config.flush_interval,
                object_bytes=config.object_bytes,
                group_commit_ms=config.group_commit_ms,
                max_in_flight=config.max_uploads_in_flight,
            ),
            first_cycle=now_ms(),
        )
        self.token = wal.new_token()
        self._seq = itertools.count()
        self.server = RpcServer(ctx.zmq_context, ctx.address())
        self.shards = [_shard_socket(ctx, i) for i in range(config.shards)]
        self._done: queue.SimpleQueue[Done] = queue.SimpleQueue()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # written by workers
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            config.max_uploads_in_flight, "upload"
        )
        self._committer = concurrent.futures.ThreadPoolExecutor(1, "commit")  # cycle order
        self._coordinator: RpcClient | None = None  # the commit thread's
        # Per active cycle: its Build and, once uploaded, the object; when it was cut.
        self._builds: dict[int, tuple[Build, BuiltObject | None]] = {}
        self._cut_at: dict[int, float] = {}  # monotonic
        self.compactor: ChunkSink | None = None  # called from the commit thread

    # -- the loop -----------------------------------------------------------------------------

    def serve(self) -> None:
        poller = zmq.Poller()
        for socket in (self.server.socket, self._wake, *self.shards):
            poller.register(socket, zmq.POLLIN)
        while True:
            if self.ctx.stopping.is_set():
                self.cycles.stop()
                if self.cycles.idle:
                    return
            events = dict(poller.poll(self._poll_ms()))
            if self.server.socket in events:
                self._serve_requests()
            for shard, socket in enumerate(self.shards):
                if socket in events:
                    self._take_cut_answers(shard, socket)
            if self._wake in events:
                os.eventfd_read(self._wake)
            while not self._done.empty():
                self._finish(self._done.get())
            self._run(self.cycles.tick(now_ms()))

    def _poll_ms(self) -> int:
        wakeup = self.cycles.wakeup_ms()
        if wakeup is None:
            return IDLE_POLL_MS
        return max(0, min(IDLE_POLL_MS, wakeup - now_ms()))

    def _serve_requests(self) -> None:
        while (incoming := self.server.recv(0)) is not None:
            message = incoming.message
            if isinstance(message, write_path.ShardPending):
                self._run(self.cycles.pending(message, now_ms()))  # a notice: no reply
            elif isinstance(message, messages.Ping):
                self.server.reply(incoming, self.ctx.pong())
            else:
                name = type(message).__name__
                self.server.reply(incoming, messages.ErrorReply(message=f"unexpected {name}"))

    def _take_cut_answers(self, shard: int, socket: zmq.Socket[bytes]) -> None:
        while socket.poll(0, zmq.POLLIN):
            frames = socket.recv_multipart()
            try:
                answer = messages.decode(frames[1]) if len(frames) >= 2 else None
            except msgspec.DecodeError:
                answer = None
            if not isinstance(answer, write_path.CutEntries):
                log.warning("unexpected answer from a shard", extra={"shard": shard})
                continue
            now = now_ms()
            self._run(self.cycles.cut_answered(answer.cycle, shard, answer.entries, now))

    def _finish(self, done: Done) -> None:
        if isinstance(done, Notify):
            self._notify(done.shard, done.message)
        elif isinstance(done, Uploaded):
            build, _ = self._builds[done.cycle]
            self._builds[done.cycle] = (build, done.built)
            ok = done.built is not None
            self._run(self.cycles.uploaded(done.cycle, ok, done.error, done.storage_error))
        else:
            self._run(self.cycles.committed(done.cycle, done.results))

    def _run(self, instructions: Iterable[Instruction]) -> None:
        work: deque[Instruction] = deque(instructions)
        while work:
            instruction = work.popleft()
            if isinstance(instruction, SendCut):
                work.extend(self._send_cut(instruction))
            elif isinstance(instruction, Build):
                self._build(instruction)
            elif isinstance(instruction, Commit):
                build, built = self._builds[instruction.cycle]
                assert built is not None  # Commit follows a successful upload only
                self._committer.submit(self._commit, build, built)
            else:
                self._answer(instruction)
        for table in (self._builds, self._cut_at):
            for number in [n for n in table if not self.cycles.active(n)]:
                del table[number]

    # -- instructions -------------------------------------------------------------------------

    def _send_cut(self, send: SendCut) -> list[Instruction]:
        metrics.WAL_CUTS.labels(send.reason).inc()
        self._cut_at[send.cycle] = time.monotonic()
        out: list[Instruction] = []
        request = [REQUEST_ID.pack(send.cycle), messages.encode(write_path.Cut(cycle=send.cycle))]
        for shard in send.shards:
            try:
                self.shards[shard].send_multipart(request, zmq.NOBLOCK)
            except (zmq.Again, IndexError):
                # Not connected (restarting): it has nothing for this cycle; its successor
                # reports what it adopts.
                out += self.cycles.cut_answered(send.cycle, shard, [], now_ms())
        return out

    def _build(self, build: Build) -> None:
        key = wal.object_key(
            self.ctx.config.s3_namespace, self.ctx.config.broker_id, self.token, next(self._seq)
        )
        self._builds[build.cycle] = (build, None)
        self._uploads.submit(self._build_and_upload, build, key)

    def _build_and_upload(self, build: Build, key: str) -> None:
        """On an upload thread: never raises, always reports."""
        try:
            built = objects.build(key, build.created_ms, build.entries)
            if built.chunks:
                objects.upload(self.objects, built)
                metrics.WAL_OBJECTS.inc()
                metrics.WAL_OBJECT_ENTRIES.observe(len(built.chunks))
            done = Uploaded(build.cycle, built)
        except ObjectStoreError as exc:
            done = Uploaded(build.cycle, None, f"the upload failed: {exc}", storage_error=True)
        except KeyTaken as exc:
            log.error("write-ahead object key taken; not overwriting", extra={"key": key})
            done = Uploaded(build.cycle, None, str(exc))
        except Exception as exc:
            log.exception("building a write-ahead object failed", extra={"key": key})
            done = Uploaded(build.cycle, None, f"{type(exc).__name__}: {exc}")
        self._report(done)

    def _commit(self, build: Build, built: BuiltObject) -> None:
        """On the commit thread: never raises, always reports."""
        try:
            reply = self._ask_coordinator(built) if built.chunks else None
            results = commits.entry_results(build.entries, built, reply)
        except Exception as exc:
            log.exception("committing a write-ahead object failed", extra={"key": built.key})
            error = f"{type(exc).__name__}: {exc}"
            results = [cycle.failed(entry, error, False) for entry in build.entries]
        self._hand_to_compactor(built, results)
        self._report(Committed(build.cycle, results))

    def _ask_coordinator(self, built: BuiltObject) -> messages.Message:
        if self._coordinator is None:
            address = endpoints.address(self.ctx.runtime_dir, "coordinator")
            self._coordinator = RpcClient(self.ctx.zmq_context, address)
        request = commits.commit_request(built, self.ctx.config.broker_id)
        try:
            return self._coordinator.call(request, timeout_ms=COMMIT_TIMEOUT_MS).message
        except RpcError as exc:
            return messages.ErrorReply(message=str(exc))

    def _hand_to_compactor(self, built: BuiltObject, results: list[EntryResult]) -> None:
        if self.compactor is None:
            return
        for chunk in built.chunks:
            if results[chunk.index].segment is not None:  # committed, by this object
                entry = chunk.entry
                self.compactor.committed(
                    entry.topic,
                    entry.topic_id,
                    entry.partition,
                    entry.segment_bytes or self.ctx.config.segment_bytes,
                    chunk.record,
                    chunk.data,
                )

    def _answer(self, answer: Answer) -> None:
        cut_at = self._cut_at.get(answer.cycle)
        upload_ms = int((time.monotonic() - cut_at) * 1000) if cut_at is not None else 0
        _count(answer.results, now_ms())
        notice = write_path.ObjectCommitted(
            cycle=answer.cycle, results=answer.results, upload_ms=upload_ms
        )
        self._notify(answer.shard, notice)

    def _notify(self, shard: int, message: messages.Message) -> None:
        try:
            self.shards[shard].send_multipart(
                [REQUEST_ID.pack(0), messages.encode(message)], zmq.NOBLOCK
            )
        except (zmq.Again, IndexError):
            log.warning(
                "shard not connected; notice dropped",
                extra={"shard": shard, "notice": type(message).__name__},
            )

    def notify_from_thread(self, shard: int, message: messages.Message) -> None:
        """``notify`` for other threads (the compactor's): the loop thread sends it."""
        self._report(Notify(shard, message))

    def _report(self, done: Done) -> None:
        self._done.put(done)
        os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        self._uploads.shutdown(wait=True)
        self._committer.shutdown(wait=True)
        if self._coordinator is not None:
            self._coordinator.close()
        for socket in self.shards:
            socket.close(linger=0)
        os.close(self._wake)
        self.server.close()


def _shard_socket(ctx: ChildContext, index: int) -> zmq.Socket[bytes]:
    socket: zmq.Socket[bytes] = ctx.zmq_context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.IMMEDIATE, 1)  # nothing queues for a shard that is not there
    socket.setsockopt(zmq.RECONNECT_IVL, 50)
    socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    socket.connect(endpoints.address(ctx.runtime_dir, "shard", index))
    return socket


def _count(results: list[EntryResult], now: int) -> None:
    for result in results:
        if result.committed:
            metrics.FLUSHES.inc()
            if result.segment is not None:
                metrics.FLUSH_BYTES.inc(result.segment.size)
                metrics.FLUSH_SECONDS.observe(max(0, now - result.segment.created_ms) / 1000)
        elif result.storage_error:
            metrics.FLUSH_ERRORS.labels("storage").inc()
        elif result.topic_gone:
            metrics.FLUSH_ERRORS.labels("topic_gone").inc()
        else:
            metrics.FLUSH_ERRORS.labels("refused").inc()


class _CoordinatorCommits:
    """The log cleaner's ``commit``: its own coordinator client, made on its thread at first
    use. Raises when the coordinator does not answer or fails the request."""

    def __init__(self, new_client: Callable[[], RpcClient]) -> None:
        self._new_client = new_client
        self._client: RpcClient | None = None

    def __call__(self, request: CommitCleaning) -> SegmentCommitted:
        if self._client is None:
            self._client = self._new_client()
        reply = self._client.call(request, timeout_ms=COMMIT_TIMEOUT_MS).message
        if isinstance(reply, messages.ErrorReply):
            raise RpcError(f"the coordinator could not commit: {reply.message}")
        if not isinstance(reply, SegmentCommitted):
            raise RpcError(f"unexpected answer {type(reply).__name__}")
        return reply


def run(ctx: ChildContext) -> None:
    config = ctx.config
    objects_ = MeteredObjectStore(open_object_store(config))
    objects_.check()
    store = open_metadata_store(config)
    coordinator_address = endpoints.address(ctx.runtime_dir, "coordinator")
    coordinator = RpcClient(ctx.zmq_context, coordinator_address)
    flusher: Flusher | None = None
    compactor: Compactor | None = None
    cleaner: Cleaner | None = None
    owned = OwnedPartitions(store, config.s3_namespace, config.broker_id, ctx.lease_id)
    try:
        recovery.adopt_orphans(config, objects_, store, coordinator)
        flusher = Flusher(ctx, objects_)

        def coordinators() -> RpcClient:
            return RpcClient(ctx.zmq_context, coordinator_address)

        owned.start()
        compactor = Compactor(
            config,
            objects_,
            store,
            coordinators,
            flusher.notify_from_thread,
            config.shards,
            owned=owned.partitions,
        )
        compactor.start()
        flusher.compactor = compactor
        if config.cleaner_enable:
            cleaner = Cleaner(
                config,
                objects_,
                store,
                _CoordinatorCommits(coordinators),
                flusher.notify_from_thread,
                owned=owned.partitions,
            )
            cleaner.start()
        log.info("flusher up", extra={"objects": objects_.description, "token": flusher.token})
        ctx.ready()
        flusher.serve()
    finally:
        if cleaner is not None:
            cleaner.close()  # first, as the compactor: its notices go through the flusher's loop
        if compactor is not None:
            compactor.close()  # first: its notices go through the flusher's loop
        if flusher is not None:
            flusher.close()
        owned.stop()
        coordinator.close()
        store.close()
        objects_.close()
