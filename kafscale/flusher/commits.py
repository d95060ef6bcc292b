"""What the flusher asks the coordinator to commit for an object, and what each entry hears.

Pure: ``commit_request`` makes the ``CommitObject`` of a built object (its ``WalRecord`` and a
chunk per entry that made it into the object); ``entry_results`` maps the coordinator's answer
back to one ``EntryResult`` per entry of the cycle, in the cycle's order, which is what
``Cycles.committed`` takes. Entries left out of the object fail with the reason they were left
out; when the coordinator could not answer (``ErrorReply``, a transport error, an answer of the
wrong shape) every other entry fails as a storage error: the shard offers it again, and a
commit that did happen is answered "committed earlier" the next time.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafscale.flusher.cycle import failed
from kafscale.flusher.objects import BuiltObject
from kafscale.ipc import messages, write_path
from kafscale.ipc.write_path import EntryResult, WalEntry
from kafscale.metadata.records import WalRecord


def commit_request(built: BuiltObject, broker_id: int) -> write_path.CommitObject:
    """The ``CommitObject`` of an object with at least one chunk."""
    chunks = [
        write_path.ObjectChunk(
            topic=chunk.entry.topic,
            topic_id=chunk.entry.topic_id,
            partition=chunk.entry.partition,
            chunk=chunk.record,
            producers=chunk.entry.producers,
            leader_epoch=chunk.entry.leader_epoch,
        )
        for chunk in built.chunks
    ]
    wal = WalRecord(
        key=built.key,
        size=built.size,
        created_ms=built.created_ms,
        broker_id=broker_id,
        entries=[(c.topic, c.partition, c.chunk.base_offset) for c in chunks],
    )
    return write_path.CommitObject(wal=wal, chunks=chunks)


def entry_results(
    entries: Sequence[WalEntry], built: BuiltObject, reply: messages.Message | None
) -> list[EntryResult]:
    """One result per entry, in order, given the coordinator's ``reply`` to the object's
    ``CommitObject`` (None: nothing was asked, the object has no chunk)."""
    results: list[EntryResult | None] = [None] * len(entries)
    for index, reason in built.failures.items():
        results[index] = failed(entries[index], f"left out of the object: {reason}", False)
    answers = _answers(reply, len(built.chunks))
    for chunk, answer in zip(built.chunks, answers, strict=True):
        entry = chunk.entry
        if isinstance(answer, str):
            results[chunk.index] = failed(entry, answer, storage_error=True)
        else:
            results[chunk.index] = EntryResult(
                topic=entry.topic,
                partition=entry.partition,
                base_offset=entry.base_offset,
                committed=answer.committed,
                high_watermark=answer.high_watermark,
                error=answer.error,
                topic_gone=answer.topic_gone,
                # Committed earlier: the log's chunk is in another object; None makes the
                # shard read the partition's entries back.
                segment=chunk.record if answer.committed and not answer.earlier else None,
            )
    missing = [i for i, result in enumerate(results) if result is None]
    if missing:
        raise ValueError(f"entries {missing} are neither in the object nor left out")
    return [result for result in results if result is not None]


def _answers(
    reply: messages.Message | None, count: int
) -> Sequence[write_path.ChunkCommitted | str]:
    """The coordinator's answer per chunk, or the same failure text for every chunk."""
    if reply is None and count == 0:
        return []
    if isinstance(reply, write_path.ObjectCommitResult) and len(reply.results) == count:
        return reply.results
    if isinstance(reply, messages.ErrorReply):
        return [f"the coordinator could not commit: {reply.message}"] * count
    return [f"unexpected answer from the coordinator: {type(reply).__name__}"] * count
