"""What producers were told and what consumers read, and the checks every fault test makes.

One `History` per test: producers record each acknowledged record (`acked`), readers every
record they read (`read`). `check()` asserts the broker's promises, the same for every test
(scale-out, chaos):

- **nothing acknowledged is lost**: every acked record was read, at the offset it was acked at;
- **no duplicates**: a value is read at most once (producers are idempotent, so a retry that
  the broker had already committed must not appear twice);
- **order**: within a partition, each producer's records are at increasing offsets in the order
  it sent them;
- **one value per offset**: an offset read twice (two readers, two passes) holds the same value.

Values carry their producer and sequence (`value(producer, seq)`), so order and duplicates are
checked without trusting anything the broker says.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

Partition = tuple[str, int]


def value(producer: str, seq: int) -> bytes:
    return f"{producer}:{seq:09d}".encode()


def parse(data: bytes) -> tuple[str, int]:
    producer, _, seq = data.decode().rpartition(":")
    return producer, int(seq)


@dataclass
class History:
    acked: dict[bytes, tuple[Partition, int]] = field(default_factory=dict)
    read: dict[Partition, dict[int, bytes]] = field(default_factory=lambda: defaultdict(dict))
    conflicts: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, topic: str, partition: int, offset: int, data: bytes) -> None:
        with self._lock:
            self.acked[data] = ((topic, partition), offset)

    def saw(self, topic: str, partition: int, offset: int, data: bytes) -> None:
        with self._lock:
            key = (topic, partition)
            known = self.read[key].get(offset)
            if known is not None and known != data:
                self.conflicts.append(f"{key} offset {offset}: {known!r} and {data!r}")
            self.read[key][offset] = data

    def check(self) -> str:
        """Assert every promise; a one-line summary for the test's log."""
        assert not self.conflicts, f"offsets with two values: {self.conflicts[:5]}"
        located: dict[bytes, tuple[Partition, int]] = {}
        duplicates = []
        for partition, records in self.read.items():
            for offset, data in records.items():
                if data in located:
                    duplicates.append(f"{data!r} at {located[data]} and {(partition, offset)}")
                located[data] = (partition, offset)
        assert not duplicates, f"{len(duplicates)} duplicates: {duplicates[:5]}"
        lost = [
            f"{data!r} acked at {where}, read at {located.get(data)}"
            for data, where in self.acked.items()
            if located.get(data) != where
        ]
        assert not lost, f"{len(lost)} acknowledged records lost or moved: {lost[:5]}"
        for partition in self.read:
            by_producer: dict[str, list[int]] = defaultdict(list)
            for offset in sorted(self.read[partition]):
                producer, seq = parse(self.read[partition][offset])
                by_producer[producer].append(seq)
            for producer, seqs in by_producer.items():
                assert seqs == sorted(seqs), f"{partition}: {producer}'s records out of order"
        total = sum(len(records) for records in self.read.values())
        return f"{len(self.acked)} acked, {total} read, no loss, no duplicate, in order"
