"""Reading one slice on an executor: its bytes with one GET, every CRC checked, records decoded
into Arrow record batches in the Kafka source's row layout.

A whole-segment slice is verified as the broker verifies it (framing, every batch's CRC32C, the
footer's CRC32C over all batches, contiguous offsets, the header's counts); a ranged slice of a
segment, and a chunk of a write-ahead object (one ranged GET), check framing, each batch's CRC32C
and that offsets run on without a gap (a chunk: exactly its committed offsets, as
``kafscale.storage.chunks`` checks them). The row schema is the same whatever the entry's kind.
Anything that fails raises
``CorruptSegment`` naming the object: the task fails, nothing is skipped silently. Control
batches (transaction markers) are not records and are left out, as Kafka consumers do.

A batch that frames and matches its CRC but whose records do not decode (stored by something
that never validated them, e.g. attributes naming another codec than its body's) fails the task
the same way, naming the batch; with ``failOnDataLoss=false`` it is skipped instead and logged
once per batch, as Spark's Kafka source skips data it cannot read then. Decompression is
bounded (``compression.read_limit``): a zstd bomb costs the bound, not gigabytes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from kafscale.protocol import records
from kafscale.protocol.compression import CorruptCompressedData
from kafscale.protocol.records import CorruptRecordBatch, TimestampType
from kafscale.spark.plan import Slice, read_whole
from kafscale.storage import ObjectNotFound, ObjectStore, chunks
from kafscale.storage.faults import FaultLog
from kafscale.storage.segment import CorruptBatch, CorruptSegment

log = logging.getLogger(__name__)
# Per executor process: a batch skipped under failOnDataLoss=false is logged once.
_skipped = FaultLog(log, "spark")

ROWS_PER_BATCH = 8192

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
SCHEMA_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
HEADERS_FIELD = pa.field("headers", pa.list_(HEADER_TYPE))

SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
SPARK_HEADERS = "headers array<struct<key: string, value: binary>>"


def spark_schema(include_headers: bool) -> str:
    return f"{SPARK_SCHEMA}, {SPARK_HEADERS}" if include_headers else SPARK_SCHEMA


def arrow_schema(include_headers: bool) -> pa.Schema:
    return pa.schema([*SCHEMA_FIELDS, HEADERS_FIELD] if include_headers else SCHEMA_FIELDS)


def read_slice(
    objects: ObjectStore, part: Slice, include_headers: bool = True, fail_on_data_loss: bool = True
) -> Iterator[pa.RecordBatch]:
    kind = "write-ahead object" if part.chunk else "segment"
    where = f"{objects.description}: {kind} {part.key}"
    batches = _whole(objects, part) if part.whole else _ranged(objects, part, where)
    rows = _Rows(part, include_headers)
    for batch in batches:
        header = records.read_header(batch)
        if header.is_control or header.last_offset < part.from_offset:
            continue
        if header.base_offset >= part.until_offset:
            break
        log_append = int(header.timestamp_type == TimestampType.LOG_APPEND_TIME)
        try:
            # Decoded whole before any row is added: a bad batch adds nothing.
            found = [
                record
                for record in records.iter_records(batch)
                if part.from_offset <= record.offset < part.until_offset
            ]
        except (CorruptRecordBatch, CorruptCompressedData) as exc:
            fault = CorruptBatch(
                where,
                f"batch at offsets {header.base_offset}..{header.last_offset} does not "
                f"decode: {exc}",
            )
            if fail_on_data_loss:
                raise fault from None
            _skipped.report(f"{where}@{header.base_offset}", f"{fault}; skipped")
            continue
        for record in found:
            rows.add(record, log_append)
        if len(rows) >= ROWS_PER_BATCH:
            yield rows.take()
    if len(rows):
        yield rows.take()


def _whole(objects: ObjectStore, part: Slice) -> list[memoryview]:
    chunk = (part.start, part.end) if part.chunk else None
    return read_whole(objects, part.key, part.base_offset, part.last_offset, chunk)


def _ranged(objects: ObjectStore, part: Slice, where: str) -> list[memoryview]:
    try:
        data = memoryview(objects.get(part.key, part.start, part.end - part.start))
    except ObjectNotFound:
        raise CorruptSegment(
            f"{where} is gone (deleted by retention or with its topic while the read ran?)"
        ) from None
    if len(data) != part.end - part.start:
        raise CorruptSegment(
            f"{where}: {len(data)} bytes at position {part.start}, expected "
            f"{part.end - part.start} (the object is shorter than the index says)"
        )
    spans = chunks.walk_batches(data, where, part.start)
    return [data[s.position : s.position + s.length] for s in spans]


class _Rows:
    """Columns being filled for one Arrow record batch."""

    def __init__(self, part: Slice, include_headers: bool) -> None:
        self.topic, self.partition = part.topic, part.partition
        self.schema = arrow_schema(include_headers)
        self.include_headers = include_headers
        self._clear()

    def _clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, record: records.Record, timestamp_type: int) -> None:
        self.keys.append(record.key)
        self.values.append(record.value)
        self.offsets.append(record.offset)
        self.timestamps.append(record.timestamp * 1000)
        self.types.append(timestamp_type)
        if self.include_headers:
            self.headers.append(
                [
                    # header keys were decoded with surrogateescape; Arrow wants valid UTF-8
                    {"key": _text(name), "value": value}
                    for name, value in record.headers
                ]
            )

    def take(self) -> pa.RecordBatch:
        count = len(self.offsets)
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * count, pa.string()),
            pa.array([self.partition] * count, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            pa.array(self.types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, pa.list_(HEADER_TYPE)))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self._clear()
        return batch


def _text(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
