"""Idempotent producer state of one partition: epochs, sequences, and duplicate detection.

Follows Kafka's ProducerStateManager / ProducerAppendInfo for non-transactional producers (KIP-98,
KIP-360): per producer id it keeps the epoch and the last ``BATCH_HISTORY`` batches (first and last
sequence, first and last offset). A batch is

- a **duplicate** when its sequence range equals one of those batches (same epoch): acknowledged
  with the offsets it got the first time, not appended again;
- **in sequence** when it starts right after the last batch (sequences wrap at 2^31-1), or when
  the producer is unknown here (its state expired or it never wrote), or at sequence 0 after an
  epoch bump;
- otherwise refused: OUT_OF_ORDER_SEQUENCE_NUMBER for a gap, INVALID_PRODUCER_EPOCH for an epoch
  older than the one we know.

Pure state: no I/O and no clock. ``snapshot``/``restore`` turn it into plain data so it survives
a restart through the metadata store.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.records import BatchHeader

BATCH_HISTORY = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
MAX_SEQUENCE = 2**31 - 1
NO_PRODUCER_ID = -1


def next_sequence(sequence: int, increment: int = 1) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap to 0 after 2^31-1."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCH_HISTORY))
    last_timestamp: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    duplicate_of: BatchMetadata | None = None


ACCEPT = Check(Verdict.APPEND)


class ProducerStates:
    """The idempotence state of one partition, keyed by producer id."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(
        self, producer_id: int, epoch: int, base_sequence: int, last_offset_delta: int
    ) -> Check:
        """What to do with a batch from this producer; changes nothing."""
        if producer_id == NO_PRODUCER_ID:
            return ACCEPT
        entry = self.producers.get(producer_id)
        if entry is None:
            return ACCEPT  # unknown here (new, or state expired): any sequence starts it
        if epoch < entry.epoch:
            return Check(
                Verdict.REFUSE,
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id} epoch {epoch} is older than {entry.epoch}",
            )
        if epoch > entry.epoch:
            if base_sequence != 0:
                return Check(
                    Verdict.REFUSE,
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {producer_id} bumped its epoch to {epoch} but its first "
                    f"sequence is {base_sequence}, not 0",
                )
            return ACCEPT
        last_sequence = next_sequence(base_sequence, last_offset_delta)
        for batch in entry.batches:
            if batch.first_sequence == base_sequence and batch.last_sequence == last_sequence:
                return Check(Verdict.DUPLICATE, duplicate_of=batch)
        expected = next_sequence(entry.last_sequence) if entry.batches else base_sequence
        if base_sequence != expected:
            return Check(
                Verdict.REFUSE,
                ErrorCode.out_of_order_sequence_number,
                f"producer {producer_id} sent sequence {base_sequence}, expected {expected}",
            )
        return ACCEPT

    def record(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        last_offset_delta: int,
        first_offset: int,
        max_timestamp: int = -1,
    ) -> None:
        """Remember an appended batch (after ``check`` said APPEND)."""
        if producer_id == NO_PRODUCER_ID:
            return
        entry = self.producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = ProducerEntry(epoch=epoch)
            self.producers[producer_id] = entry
        entry.batches.append(
            BatchMetadata(
                first_sequence=base_sequence,
                last_sequence=next_sequence(base_sequence, last_offset_delta),
                first_offset=first_offset,
                last_offset=first_offset + last_offset_delta,
            )
        )
        entry.last_timestamp = max(entry.last_timestamp, max_timestamp)

    def record_batch(self, header: BatchHeader) -> None:
        """Remember a stored batch by its header (its offsets as stored): how a log's producer
        state is rebuilt from batches found in a buffer or an uncommitted segment."""
        self.record(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_offset_delta,
            header.base_offset,
            header.max_timestamp,
        )

    def snapshot(self) -> dict[int, tuple[int, int, list[tuple[int, int, int, int]]]]:
        """Plain data: {producer_id: (epoch, last_timestamp, [(first_seq, last_seq,
        first_offset, last_offset), ...])}."""
        return {
            pid: (
                entry.epoch,
                entry.last_timestamp,
                [
                    (b.first_sequence, b.last_sequence, b.first_offset, b.last_offset)
                    for b in entry.batches
                ],
            )
            for pid, entry in self.producers.items()
        }

    @classmethod
    def restore(
        cls, data: dict[int, tuple[int, int, list[tuple[int, int, int, int]]]]
    ) -> ProducerStates:
        states = cls()
        for pid, (epoch, last_timestamp, batches) in data.items():
            entry = ProducerEntry(epoch=epoch, last_timestamp=last_timestamp)
            entry.batches.extend(BatchMetadata(*batch) for batch in batches)
            states.producers[int(pid)] = entry
        return states

    def expire(self, older_than_timestamp: int) -> list[int]:
        """Forget producers whose last write is older than the cutoff (Kafka's
        producer.id.expiration.ms); returns their ids."""
        expired = [
            pid
            for pid, entry in self.producers.items()
            if entry.last_timestamp < older_than_timestamp
        ]
        for pid in expired:
            del self.producers[pid]
        return expired
