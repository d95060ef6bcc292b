"""A partition's committed log entries, in offset order, as the read path looks them up.

An entry is a spec segment or a chunk of a write-ahead object (``SegmentRecord.is_chunk``); the
read path treats both alike. Loaded once from the metadata store when the shard loads the
partition, then extended by every commit the shard sees, changed when chunks are compacted into
a segment or segments cleaned, and reloaded when a read finds an entry's object gone (compacted,
cleaned or deleted after the list was loaded); never an object-store listing.

Finding the entry that holds an offset is a binary search over base offsets. For timestamp
lookups a running maximum of the entries' max timestamps is kept beside them: it never
decreases, so the first entry holding a timestamp >= T is also found by binary search.
Invariant: entries are sorted by base offset and never overlap.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from kafscale.metadata.records import SegmentRecord


class CommittedSegments:
    def __init__(self, found: Iterable[SegmentRecord] = ()) -> None:
        self._segments: list[SegmentRecord] = []
        self._bases: list[int] = []
        self._max_so_far: list[int] = []
        self._rebuild(sorted(found, key=lambda s: s.base_offset))

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[SegmentRecord]:
        return iter(self._segments)

    def add(self, segment: SegmentRecord) -> None:
        """Append a newly committed entry (entries arrive in offset order); one whose offsets
        are already covered (a retried commit, or a chunk already compacted into a segment)
        is ignored."""
        if self._segments and segment.base_offset <= self._segments[-1].last_offset:
            return
        previous = self._max_so_far[-1] if self._max_so_far else -1
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._max_so_far.append(max(previous, segment.max_timestamp))

    def compacted(self, segment: SegmentRecord) -> list[SegmentRecord]:
        """Put ``segment`` in place of the entries its offsets cover (the chunks a compaction
        replaced, or the segments a cleaning rewrote) and return them. Nothing changes, and
        nothing is returned, when an entry straddles one of the segment's ends (the list does
        not match what was compacted) or when every offset it covers was dropped by retention
        already."""
        first = bisect.bisect_left(self._bases, segment.base_offset)
        stop = bisect.bisect_right(self._bases, segment.last_offset)
        replaced = self._segments[first:stop]
        straddles = (
            first > 0 and self._segments[first - 1].last_offset >= segment.base_offset
        ) or (bool(replaced) and replaced[-1].last_offset > segment.last_offset)
        retired = not replaced and stop == 0 and bool(self._segments)
        if straddles or retired or replaced == [segment]:
            return []
        self._rebuild([*self._segments[:first], segment, *self._segments[stop:]])
        return replaced

    def reloaded(self, found: Iterable[SegmentRecord], high_watermark: int) -> None:
        """Take the entries the metadata store lists now, those below ``high_watermark`` (later
        ones arrive with their commits), followed by any entry known here past them."""
        fresh = sorted(
            (s for s in found if s.last_offset < high_watermark), key=lambda s: s.base_offset
        )
        end = fresh[-1].last_offset if fresh else -1
        self._rebuild([*fresh, *(s for s in self._segments if s.base_offset > end)])

    def drop_before(self, offset: int) -> None:
        """Forget the entries that end before ``offset`` (deleted by retention)."""
        self._rebuild([s for s in self._segments if s.last_offset >= offset])

    def _rebuild(self, ordered: list[SegmentRecord]) -> None:
        self._segments, self._bases, self._max_so_far = [], [], []
        for segment in ordered:
            self.add(segment)

    def find(self, offset: int) -> SegmentRecord | None:
        """The entry holding ``offset``, if one does."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        segment = self._segments[i]
        return segment if offset <= segment.last_offset else None

    def following(self, segment: SegmentRecord, count: int) -> list[SegmentRecord]:
        """Up to ``count`` entries after ``segment``."""
        i = bisect.bisect_right(self._bases, segment.base_offset)
        return self._segments[i : i + count]

    def first_reaching(self, timestamp: int) -> SegmentRecord | None:
        """The first entry (by offset) holding a record with a timestamp >= ``timestamp``."""
        i = bisect.bisect_left(self._max_so_far, timestamp)
        return self._segments[i] if i < len(self._segments) else None

    def max_timestamp(self) -> SegmentRecord | None:
        """The first entry holding the partition's largest timestamp."""
        if not self._segments:
            return None
        return self.first_reaching(self._max_so_far[-1])

    @property
    def first_offset(self) -> int | None:
        return self._bases[0] if self._bases else None
