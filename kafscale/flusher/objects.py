"""One cycle's write-ahead object: read its entries' sealed buffers, build it, upload it.

For each ``WalEntry`` the sealed buffer is read from shared memory at the generation the shard
named (a buffer reused meanwhile fails that entry, not the object), split into its batches, and
the batches that arrived uncompressed are compressed with the entry's codec. Chunks go into the
object sorted by (topic, partition, base offset) (``kafscale.storage.wal.build_object``); each
becomes a chunk ``SegmentRecord`` pointing into the object. Building is deterministic given the
buffers, the key and the cut time.

The upload is put-if-absent: keys never repeat across flusher incarnations (a random token per
process, a sequence number per object), so a key that exists already holds our own earlier
attempt (S3 created it but the answer was lost) when it holds our very bytes; anything else is
refused loudly and never overwritten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kafscale import metrics
from kafscale.ipc.shm import PartitionBuffer, PartitionBufferError
from kafscale.ipc.write_path import WalEntry
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.storage import wal
from kafscale.storage.objects import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)


class EntryUnreadable(Exception):
    """An entry's sealed buffer cannot be read as the shard described it."""


class KeyTaken(Exception):
    """The object's key holds other bytes (never overwritten: not ours)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One entry as it landed in the object: ``index`` is its place in the cycle's entries."""

    index: int
    entry: WalEntry
    record: SegmentRecord
    data: memoryview = field(repr=False)  # the chunk's bytes inside the object


@dataclass(frozen=True, slots=True)
class BuiltObject:
    """A cycle's object, its chunks (object order), and the entries left out, by index, with
    the reason. No chunk at all: ``data`` is empty and nothing is uploaded."""

    key: str
    created_ms: int
    data: bytes = field(repr=False)
    chunks: list[Chunk]
    failures: dict[int, str]

    @property
    def size(self) -> int:
        return len(self.data)


def split_batches(data: bytes | memoryview) -> list[memoryview]:
    """The batches of a sealed buffer. The shard validated each one, so a length that does not
    frame (shared memory damaged under us) makes the entry unreadable, never a loop."""
    view = memoryview(data).cast("B")
    out, pos = [], 0
    while pos < len(view):
        if len(view) - pos < records.HEADER.size:
            raise EntryUnreadable(f"the buffer ends inside a batch header at position {pos}")
        size = records.read_header(view, pos).size
        if size < records.HEADER.size or pos + size > len(view):
            raise EntryUnreadable(f"the batch at position {pos} does not frame ({size} bytes)")
        out.append(view[pos : pos + size])
        pos += size
    return out


def chunk_input(entry: WalEntry, data: bytes | memoryview) -> wal.ChunkInput:
    """The chunk an entry's buffer bytes make, uncompressed batches compressed with its codec."""
    batches = [records.compress_batch(batch, entry.codec) for batch in split_batches(data)]
    return wal.ChunkInput(
        topic=entry.topic,
        topic_id=entry.topic_id,
        partition=entry.partition,
        base_offset=entry.base_offset,
        last_offset=entry.last_offset,
        records=entry.records,
        max_timestamp=entry.max_timestamp,
        codec=entry.codec,
        created_ms=entry.created_ms,
        batches=batches,
    )


def assemble(
    key: str, created_ms: int, entries: Sequence[WalEntry], inputs: dict[int, wal.ChunkInput]
) -> BuiltObject:
    """The object of the chunks ``inputs`` (by entry index). A chunk whose fields disagree with
    its batches is left out (with the reason), not the object."""
    failures: dict[int, str] = {}
    order = sorted(
        inputs, key=lambda i: (entries[i].topic, entries[i].partition, entries[i].base_offset)
    )
    if not order:
        return BuiltObject(key, created_ms, b"", [], failures)
    try:
        data, directory = wal.build_object([inputs[i] for i in order], created_ms)
    except ValueError:
        # Some chunk disagrees with its batches (a shard bug): find which, build without it.
        for index in order:
            try:
                wal.build_object([inputs[index]], created_ms)
            except ValueError as exc:
                failures[index] = str(exc)
        order = [i for i in order if i not in failures]
        if not order:
            return BuiltObject(key, created_ms, b"", [], failures)
        data, directory = wal.build_object([inputs[i] for i in order], created_ms)
    view = memoryview(data)
    chunks = []
    for index, placed in zip(order, directory, strict=True):
        entry = entries[index]
        record = chunk_record(key, placed)
        chunks.append(
            Chunk(index, entry, record, view[placed.position : placed.position + placed.size])
        )
    return BuiltObject(key, created_ms, data, chunks, failures)


def chunk_record(key: str, entry: wal.DirectoryEntry) -> SegmentRecord:
    """The log entry of a chunk of write-ahead object ``key`` as its directory describes it."""
    return SegmentRecord(
        base_offset=entry.base_offset,
        last_offset=entry.last_offset,
        size=entry.size,
        index_size=0,
        records=entry.records,
        max_timestamp=entry.max_timestamp,
        created_ms=entry.created_ms,
        object=key,
        position=entry.position,
        codec=entry.codec,
    )


def read_entry(entry: WalEntry) -> bytes:
    """Bytes ``[0, size)`` of the entry's sealed buffer, as of its generation."""
    try:
        buffer = PartitionBuffer.attach(entry.buffer)
    except (OSError, PartitionBufferError) as exc:
        raise EntryUnreadable(f"buffer {entry.buffer} cannot be attached: {exc}") from exc
    try:
        data = buffer.read(0, entry.size, entry.generation)
    except PartitionBufferError as exc:
        raise EntryUnreadable(f"buffer {entry.buffer}: {exc}") from exc
    finally:
        buffer.close()
    if data is None:
        raise EntryUnreadable(f"buffer {entry.buffer} was reused before it was flushed")
    return data


def build(key: str, created_ms: int, entries: Sequence[WalEntry]) -> BuiltObject:
    """Read every entry's buffer and build the object under ``key``."""
    inputs: dict[int, wal.ChunkInput] = {}
    unreadable: dict[int, str] = {}
    for index, entry in enumerate(entries):
        try:
            inputs[index] = chunk_input(entry, read_entry(entry))
        except (EntryUnreadable, records.CorruptRecordBatch) as exc:
            log.warning(
                "entry left out of the object",
                extra={"topic": entry.topic, "partition": entry.partition, "error": str(exc)},
            )
            unreadable[index] = str(exc)
    built = assemble(key, created_ms, entries, inputs)
    built.failures.update(unreadable)
    return built


def upload(objects: ObjectStore, built: BuiltObject) -> None:
    """Put the object if absent; our own bytes already there is success. Raises
    ObjectStoreError (S3 failed: retriable) or KeyTaken."""
    started = time.monotonic()
    try:
        created = objects.put_if_absent(built.key, built.data)
        if not created and objects.get(built.key) != built.data:
            raise KeyTaken(f"{built.key} exists with other bytes")
    except ObjectStoreError:
        metrics.S3_ERRORS.labels("put").inc()
        raise
    metrics.S3_PUT_SECONDS.observe(time.monotonic() - started)
    if not created:
        log.info("object already uploaded (our own retry)", extra={"key": built.key})
