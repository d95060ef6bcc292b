"""Taking over the buffers a dead predecessor left in /dev/shm: the I/O half of adoption.

At boot, before the shard reports ready (so before any append can be given an offset), it lists
its own segments of this run (same run id, same shard index), attaches each as owner, reads the
headers and the committed state of the partitions they name, lets ``kafscale.shards.adoption``
decide, then carries the decisions out: discarded buffers are unlinked (each with a log line
saying why; an anomaly at error level), torn tails truncated, and the adopted buffers handed
back in offset order for the shard to rebuild its partitions from. Nothing is unlinked before
every decision is made, so a takeover that fails (e.g. the metadata store is unreachable) leaves
the buffers for the next incarnation to try again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kafscale.ipc.shm import (
    BufferFormatError,
    BufferOwner,
    PartitionBuffer,
    shard_segments,
    unlink_segment,
)
from kafscale.shards.adoption import (
    AdoptedPartition,
    Committed,
    FoundBuffer,
    owner_key,
    plan_adoption,
)

log = logging.getLogger(__name__)


@dataclass
class Takeover:
    partitions: list[tuple[AdoptedPartition, list[PartitionBuffer]]]
    last_slot: int  # the highest slot number found (-1: none)


def take_over(
    run_id: str, shard: int, committed_state: Callable[[BufferOwner], Committed]
) -> Takeover:
    """Adopt what the predecessor of shard ``shard`` left; ``committed_state`` reads a
    partition's committed state (and may raise: then nothing is changed)."""
    opened: dict[str, PartitionBuffer] = {}
    unreadable: list[tuple[str, str]] = []
    unreadable_slots: list[int] = []
    try:
        with contextlib.ExitStack() as views:
            found = []
            for name, slot in shard_segments(run_id, shard):
                if slot is None:
                    unreadable.append((name, "not a buffer name"))
                    continue
                buffer = _attach(name, unreadable)
                if buffer is None:
                    unreadable_slots.append(slot)
                    continue
                opened[name] = buffer
                try:
                    owner = buffer.owner()
                except BufferFormatError as exc:
                    unreadable.append((name, str(exc)))
                    unreadable_slots.append(slot)
                    continue
                state = buffer.snapshot()
                end = min(state.committed, buffer.capacity)
                data = views.enter_context(buffer.view(0, end, state.generation))
                found.append(
                    FoundBuffer(name, slot, owner, state, buffer.capacity, buffer.interrupted, data)
                )
            owners = {buffer.owner for buffer in found}
            committed = {owner_key(owner): committed_state(owner) for owner in owners}
            plan = plan_adoption(found, committed, unreadable_slots)
    except BaseException:
        for buffer in opened.values():
            buffer.close()
        raise
    for name, reason in unreadable:
        log.error("removing an unreadable buffer", extra={"buffer": name, "reason": reason})
        buffer = opened.pop(name, None)
        if buffer is not None:
            buffer.destroy()
        else:
            unlink_segment(name)
    for discarded in plan.discarded:
        level = logging.ERROR if discarded.anomaly else logging.INFO
        extra = {"buffer": discarded.name, "reason": discarded.reason}
        log.log(level, "discarding a buffer of the previous incarnation", extra=extra)
        opened.pop(discarded.name).destroy()
    partitions = [(adopted, _take(adopted, opened)) for adopted in plan.partitions]
    assert not opened, f"undecided buffers: {sorted(opened)}"
    return Takeover(partitions, plan.last_slot)


def _attach(name: str, unreadable: list[tuple[str, str]]) -> PartitionBuffer | None:
    try:
        return PartitionBuffer.attach(name, writable=True)
    except FileNotFoundError:
        return None  # gone meanwhile: nothing to adopt
    except BufferFormatError as exc:
        unreadable.append((name, str(exc)))
        return None


def _take(adopted: AdoptedPartition, opened: dict[str, PartitionBuffer]) -> list[PartitionBuffer]:
    owner = adopted.owner
    buffers = []
    for info in adopted.buffers:
        buffer = opened.pop(info.name)
        if info.truncated:
            log.error(
                "dropping the unverifiable tail of a buffer",
                extra={"buffer": info.name, "kept_bytes": info.size, "reason": info.dropped},
            )
            buffer.truncate(info.size, info.batches, info.records)
        buffers.append(buffer)
    log.warning(
        "adopted the buffers of a previous incarnation",
        extra={
            "topic": owner.topic,
            "partition": owner.partition,
            "high_watermark": adopted.high_watermark,
            "next_offset": adopted.next_offset,
            "buffers": [info.name for info in adopted.buffers],
            "bytes": sum(info.size for info in adopted.buffers),
        },
    )
    return buffers
