"""The read path's caches (``EntryCache``): L1 holds record batches of committed log entries,
L2 parsed segment indexes.

Both are least-recently-used caches bounded by bytes. Each shard has its own pair, sized
``KAFSCALE_CACHE_SIZE / shards`` and ``KAFSCALE_INDEX_CACHE_SIZE / shards``: a partition belongs to
exactly one shard, so an entry is cached once per broker and the per-broker totals hold.

An entry is a spec segment or a chunk of a write-ahead object; its key is (topic id, partition,
base offset, the chunk's object, or "" for a segment, "g{n}" for a segment of the log cleaner's
generation n), so a segment that replaced chunks (at the first chunk's base offset) is never
mistaken for the chunk, nor a cleaned segment (fewer records) for the one it replaced. L1 values
are ``Chunk``s (the name of the cache's unit, not of a write-ahead chunk): a run of whole batches
of one entry, with where each batch starts and which offsets it ends at, so a fetch slices out
the batches it needs without decoding or copying anything. A ``Chunk`` is either a whole entry
(read in full, or the buffer the shard just committed) or the part of one a ranged read brought
in; an entry may have several partial ones.

A fetch whose entry ends before its ``max_bytes`` goes on into the entries after it while they
are cached (``Chunk.gather``): their batches are copied behind its own into one ``Chunk`` that
lives only as long as the answer; nothing is read for it (read-ahead does that). Without
anything to add, the cached chunk itself is answered, uncopied.

A segment of a compacted topic, once cleaned, has gaps: the offsets of the records the cleaner
removed, anywhere, also before its first batch and after its last; it may have no batch at all
(docs/design/ecosystem.md, section 4.4). A ``Chunk`` of it still begins at the first offset it
covers, and a fetch takes the batches from the first one that ends at or after its offset.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kafscale import metrics
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.storage.segment import Index

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# topic id, partition, entry base offset, the chunk's object ("" for a segment, "g{n}" for a
# cleaned one)
SegmentKey = tuple[str, int, int, str]


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
    """Whole record batches of one entry (or, for a fetch's answer, of consecutive entries),
    back to back in ``data``.

    ``starts[i]`` is where batch ``i`` begins in ``data`` and ``lasts[i]`` its last offset; the
    first batch begins at ``first_offset`` (in a cleaned segment: at or after it). ``complete``
    says the chunk is the whole entry (a cleaned segment's may hold no batch)."""

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
        """Whether the chunk begins at or before ``offset`` and a batch ends at or after it."""
        return bool(self.lasts) and self.first_offset <= offset <= self.lasts[-1]

    def batches_from(self, offset: int, max_bytes: int) -> memoryview:
        """The batches from the one holding ``offset``: as many as fit in ``max_bytes``, and at
        least one (a batch bigger than the limit is still returned whole, as Kafka does)."""
        i = bisect.bisect_left(self.lasts, offset)
        return self._span(i, max(self._fitting(i, max_bytes), i + 1))

    def begins(self, offset: int) -> int | None:
        """The index of the batch beginning at ``offset``, if one does."""
        i = bisect.bisect_left(self.lasts, offset)
        if (
            i == len(self.starts)
            or records.read_header(self.data, self.starts[i]).base_offset != offset
        ):
            return None
        return i

    def gather(
        self, offset: int, max_bytes: int, following: Callable[[int], Chunk | None]
    ) -> Chunk:
        """What a fetch at ``offset`` may take, up to ``max_bytes``: the batches ``batches_from``
        gives and, when they run to this chunk's end with room left, the batches after them
        in other chunks, while whole ones fit. ``following(o)`` is a chunk in which a batch
        begins at offset ``o`` (the one after the last taken), or None: the run stops there.
        This chunk itself when nothing is added (no copy); else a copy of the batches taken,
        from the one holding ``offset``."""
        i = bisect.bisect_left(self.lasts, offset)
        taken = [(self, i, max(self._fitting(i, max_bytes), i + 1))]
        size = len(self._span(i, taken[0][2]))
        current, end = self, taken[0][2]
        while end == len(current.starts) and size < max_bytes:
            after = current.last_offset + 1
            following_chunk = following(after)
            start = None if following_chunk is None else following_chunk.begins(after)
            if following_chunk is None or start is None:
                break
            current = following_chunk
            end = current._fitting(start, max_bytes - size)
            if end == start:
                break
            taken.append((current, start, end))
            size += len(current._span(start, end))
        if len(taken) == 1:
            return self
        return _joined(taken)

    def _fitting(self, i: int, room: int) -> int:
        """One past the last of the batches from ``i`` that fit in ``room`` bytes (``i`` when
        none does)."""
        j = i
        while j < len(self.starts) and self._end(j) - self.starts[i] <= room:
            j += 1
        return j

    def _span(self, i: int, j: int) -> memoryview:
        """Batches ``i`` to ``j - 1``."""
        return memoryview(self.data)[self.starts[i] : self._end(j - 1)]

    def _end(self, i: int) -> int:
        """Where batch ``i`` ends."""
        return self.starts[i + 1] if i + 1 < len(self.starts) else len(self.data)

    def batch_bytes(self, i: int) -> memoryview:
        return self._span(i, i + 1)


def _joined(taken: list[tuple[Chunk, int, int]]) -> Chunk:
    """One chunk copying batches ``[i, j)`` of each chunk taken, in order."""
    views: list[memoryview] = []
    starts: list[int] = []
    lasts: list[int] = []
    position = 0
    for chunk, i, j in taken:
        view = chunk._span(i, j)
        starts.extend(position + start - chunk.starts[i] for start in chunk.starts[i:j])
        lasts.extend(chunk.lasts[i:j])
        views.append(view)
        position += len(view)
    data = b"".join(views)
    first = records.read_header(data, 0).base_offset
    return Chunk(data, first, tuple(starts), tuple(lasts), complete=False)


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


class PartitionName(Protocol):
    @property
    def topic_id(self) -> str: ...

    @property
    def partition(self) -> int: ...


def entry_key(partition: PartitionName, entry: SegmentRecord) -> SegmentKey:
    """The caches' key of a partition's entry."""
    name = entry.object or (f"g{entry.generation}" if entry.generation else "")
    return (partition.topic_id, partition.partition, entry.base_offset, name)


class EntryCache:
    """A shard's L1 (batches of committed entries) and L2 (segment indexes), with their
    metrics."""

    def __init__(self, segment_bytes: int, index_bytes: int, label: str) -> None:
        self.segments: ByteLRU[SegmentKey, tuple[Chunk, ...]] = ByteLRU(segment_bytes)
        self.indexes: ByteLRU[SegmentKey, Index] = ByteLRU(index_bytes)
        self.label = label

    def cached(self, key: SegmentKey, offset: int, whole: bool = False) -> Chunk | None:
        """A cached run of batches of entry ``key`` holding ``offset`` (the whole entry with
        ``whole``)."""
        for chunk in self.segments.get(key) or ():
            if chunk.holds(offset) and (chunk.complete or not whole):
                metrics.CACHE_LOOKUPS.labels("segment", "hit").inc()
                return chunk
        metrics.CACHE_LOOKUPS.labels("segment", "miss").inc()
        return None

    def continuing(self, key: SegmentKey, offset: int) -> Chunk | None:
        """A cached run of batches of entry ``key`` in which a batch begins at ``offset`` (a
        fetch's answer going on from the entry before, or from an earlier run of this one)."""
        for chunk in self.segments.get(key) or ():
            if chunk.holds(offset) and chunk.begins(offset) is not None:
                return chunk
        return None

    def passed(self, key: SegmentKey, offset: int) -> bool:
        """Whether the whole entry ``key`` is cached and holds no batch ending at or after
        ``offset`` (the tail of a cleaned segment, or one left with no batch): a fetch goes on
        to the next entry."""
        return any(
            c.complete and (not c.lasts or c.lasts[-1] < offset)
            for c in self.segments.get(key) or ()
        )

    def holds_whole(self, key: SegmentKey) -> bool:
        return any(c.complete for c in self.segments.peek(key) or ())

    def holds_all(self, key: SegmentKey, last_offset: int) -> bool:
        """Every batch of entry ``key`` (its base offset to ``last_offset``) is cached: the
        whole entry, or parts that join up without a gap (the chunks a compaction replaced,
        moved here by ``move``; ranged reads that came to cover it). Reading such an entry
        again would bring nothing new."""
        held = self.segments.peek(key) or ()
        if any(c.complete for c in held):
            return True
        expected = key[2]  # the next offset a part must begin at or before
        for chunk in sorted(held, key=lambda c: c.first_offset):
            if expected > last_offset:
                break  # covered; parts beyond the entry's end do not matter
            if chunk.first_offset > expected:
                return False
            expected = max(expected, chunk.last_offset + 1)
        return bool(held) and expected > last_offset

    def store(self, key: SegmentKey, chunk: Chunk) -> None:
        """Keep ``chunk``: a whole entry replaces the parts held; a part is added unless the
        whole entry is held."""
        held = self.segments.peek(key) or ()
        if chunk.complete:
            chunks: tuple[Chunk, ...] = (chunk,)
        elif any(c.complete for c in held):
            return
        else:
            chunks = (*held, chunk)
        self.segments.put(key, chunks, sum(len(c) for c in chunks))

    def move(self, replaced: list[SegmentKey], key: SegmentKey) -> None:
        """Entries ``replaced`` became entry ``key`` (chunks compacted into a segment, the same
        batches): what is cached of them is kept, as parts of ``key``."""
        for old in replaced:
            held = self.segments.peek(old) or ()
            self.segments.discard(old)
            for chunk in held:
                self.store(key, dataclasses.replace(chunk, complete=False))

    def index(self, key: SegmentKey) -> Index | None:
        index = self.indexes.get(key)
        metrics.CACHE_LOOKUPS.labels("index", "miss" if index is None else "hit").inc()
        return index

    def put_index(self, key: SegmentKey, index: Index, size: int) -> None:
        self.indexes.put(key, index, max(size, 1))

    def publish(self) -> None:
        """Set the cache's gauges (the shard does, now and then: a gauge write per store cost
        ~10% of a shard's CPU with hundreds of partitions committing every cycle)."""
        metrics.CACHE_BYTES.labels("segment", self.label).set(self.segments.used)
        metrics.CACHE_BYTES.labels("index", self.label).set(self.indexes.used)
