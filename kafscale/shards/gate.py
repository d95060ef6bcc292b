"""The read path's object-store gate: what a shard's reads answer while S3 fails.

A read that fails because the store cannot be reached (``ObjectStoreError`` other than a missing
object) closes the gate: every read that needs the store is refused at once with
KAFKA_STORAGE_ERROR (which every client retries silently) for ``READ_BACKOFF_MS``. Then one read
goes through as a probe; its outcome opens the gate (``healthy``) or closes it again. Cached and
buffered data never pass through here. A fault of the data itself (a corrupt or missing object,
a batch that does not decode) leaves the gate alone: it fails only the reads of that data, and
is logged once per object (``FaultLog``).

Clients learn the error class and, for a batch that does not decode, which batch; object keys and
the backend's text (endpoints, bucket) go to the log only. The clock is given, so the gate's
decisions are tested without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kafscale import metrics
from kafscale.protocol import records
from kafscale.protocol.errors import ErrorCode
from kafscale.storage.faults import FaultLog
from kafscale.storage.objects import ObjectNotFound, ObjectStoreError
from kafscale.storage.segment import CorruptBatch, CorruptSegment

log = logging.getLogger("kafscale.shards.reader")

READ_BACKOFF_MS = 1000

Refusal = tuple[ErrorCode, str]


class ReadGate:
    def __init__(self, label: str, clock: Callable[[], int]) -> None:
        self.label = label
        self.now = clock
        self.faults = FaultLog(log, "shard", metrics.READ_FAULTS.labels("shard").inc)
        self.degraded = False
        self._refuse_until_ms = 0
        self._probing = False
        metrics.S3_READ_HEALTHY.labels(label).set(1)

    def refusal(self) -> Refusal | None:
        """The error to answer a read that needs the store now, or None: the read may go (as
        the probe, when the gate is closed and its backoff has passed)."""
        if self.degraded:
            if self.now() < self._refuse_until_ms or self._probing:
                return ErrorCode.kafka_storage_error, "the object store is unavailable; retry later"
            self._probing = True  # this read finds out whether the store is back
        return None

    def answered(self) -> None:
        """A read reached the store and got an answer that says nothing of the data's health
        (a chunk's object gone, to be looked up again): the next read may probe."""
        self._probing = False

    def failure(self, key: str, error: BaseException | None) -> Refusal:
        """The error to answer for a read of ``key`` that failed with ``error``; closes the
        gate when the store itself failed."""
        self._probing = False  # whatever the probe found, the next read may probe again
        if isinstance(error, ObjectStoreError) and not isinstance(error, ObjectNotFound):
            if not self.degraded:
                log.error("object store read failed: refusing reads that need it", exc_info=error)
            self.degraded = True
            self._refuse_until_ms = self.now() + READ_BACKOFF_MS
            metrics.S3_READ_HEALTHY.labels(self.label).set(0)
            return ErrorCode.kafka_storage_error, "the object store cannot be read; retry later"
        if isinstance(error, (CorruptSegment, ObjectNotFound, records.CorruptRecordBatch)):
            # A batch that does not decode is named by partition and offsets (useful, and no
            # location); other faults name an object key, which stays in the log.
            self.faults.report(key, str(error))
            if isinstance(error, CorruptBatch):
                return (
                    ErrorCode.kafka_storage_error,
                    f"committed data cannot be read: {error.fault}",
                )
            return (
                ErrorCode.kafka_storage_error,
                "committed data cannot be read (corrupt or missing object)",
            )
        log.error("read failed", exc_info=error, extra={"key": key})
        return (
            ErrorCode.unknown_server_error,
            f"reading the partition failed ({type(error).__name__})",
        )

    def healthy(self) -> None:
        """A read from the store succeeded: open the gate."""
        if self.degraded:
            log.info("object store reads succeed again")
            self.degraded = self._probing = False
            metrics.S3_READ_HEALTHY.labels(self.label).set(1)
