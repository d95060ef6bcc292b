"""The read path's caches: L1 holds record batches of committed segments, L2 parsed indexes.

Both are least-recently-used caches bounded by bytes. Each shard has its own pair, sized
``KAFSCALE_CACHE_SIZE / shards`` and ``KAFSCALE_INDEX_CACHE_SIZE / shards``: a partition belongs to
exactly one shard, so a segment is cached once per broker and the per-broker totals hold.

L1 entries are ``Chunk``s: a run of whole batches of one segment, with where each batch starts
and which offsets it ends at, so a fetch slices out the batches it needs without decoding or
copying anything. A chunk is either a whole segment (read in full, or the buffer the shard just
flushed) or the part of a segment a ranged read brought in. Lookups go by (partition, segment base
offset, offset); a segment may have several partial chunks.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafscale.protocol import records

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    """A mapping that evicts the least recently used entries to stay within ``capacity`` bytes.
    An entry larger than the whole capacity is not kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def peek(self, key: K) -> V | None:
        """The value without making it recently used."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def put(self, key: K, value: V, size: int) -> list[K]:
        """Insert or replace; returns the keys evicted to make room."""
        self.discard(key)
        if size > self.capacity:
            return []
        evicted: list[K] = []
        while self.used + size > self.capacity and self._entries:
            old, (_, old_size) = self._entries.popitem(last=False)
            self.used -= old_size
            evicted.append(old)
        self._entries[key] = (value, size)
        self.used += size
        return evicted

    def discard(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used -= entry[1]


@dataclass(frozen=True, slots=True)
class Chunk:
    """Whole record batches of one segment, back to back in ``data``.

    ``starts[i]`` is where batch ``i`` begins in ``data`` and ``lasts[i]`` its last offset; the
    first batch begins at ``first_offset``. ``complete`` says the chunk is the whole segment."""

    data: bytes | memoryview
    first_offset: int
    starts: tuple[int, ...]
    lasts: tuple[int, ...]
    complete: bool

    @property
    def last_offset(self) -> int:
        return self.lasts[-1]

    def __len__(self) -> int:
        return len(self.data)

    def holds(self, offset: int) -> bool:
        return self.first_offset <= offset <= self.lasts[-1]

    def batches_from(self, offset: int, max_bytes: int) -> memoryview:
        """The batches from the one holding ``offset``: as many as fit in ``max_bytes``, and at
        least one (a batch bigger than the limit is still returned whole, as Kafka does)."""
        i = bisect.bisect_left(self.lasts, offset)
        count = len(self.starts)
        start = self.starts[i]
        j = i + 1  # one past the last batch taken
        while j < count and self._end(j) - start <= max_bytes:
            j += 1
        return memoryview(self.data)[start : self._end(j - 1)]

    def _end(self, i: int) -> int:
        """Where batch ``i`` ends."""
        return self.starts[i + 1] if i + 1 < len(self.starts) else len(self.data)

    def batch_bytes(self, i: int) -> memoryview:
        return memoryview(self.data)[self.starts[i] : self._end(i)]


def chunk_of(
    data: bytes | memoryview, first_offset: int | None = None, complete: bool = False
) -> Chunk:
    """A chunk over ``data``, which must hold whole v2 batches and nothing else (the caller has
    checked them). The batch headers are read to find the boundaries."""
    starts: list[int] = []
    lasts: list[int] = []
    position = 0
    while position < len(data):
        header = records.read_header(data, position)
        starts.append(position)
        lasts.append(header.last_offset)
        position += header.size
    if not starts:
        raise ValueError("a chunk needs at least one batch")
    first = records.read_header(data, 0).base_offset if first_offset is None else first_offset
    return Chunk(data, first, tuple(starts), tuple(lasts), complete)
