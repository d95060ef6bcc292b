"""A partition's committed segments, in offset order, as the read path looks them up.

Loaded once from the metadata store when the shard loads the partition, then extended by every
flush the shard sees committed; never an object-store listing. Finding the segment that holds an
offset is a binary search over base offsets. For timestamp lookups a running maximum of the
segments' max timestamps is kept beside them: it never decreases, so the first segment holding a
timestamp >= T is also found by binary search.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from kafscale.metadata.records import SegmentRecord


class CommittedSegments:
    def __init__(self, found: Iterable[SegmentRecord] = ()) -> None:
        self._segments: list[SegmentRecord] = []
        self._bases: list[int] = []
        self._max_so_far: list[int] = []
        for segment in sorted(found, key=lambda s: s.base_offset):
            self.add(segment)

    def __len__(self) -> int:
        return len(self._segments)

    def add(self, segment: SegmentRecord) -> None:
        """Append a newly committed segment (segments arrive in offset order); a segment already
        known (a retried commit) is ignored."""
        if self._segments and segment.base_offset <= self._segments[-1].base_offset:
            return
        previous = self._max_so_far[-1] if self._max_so_far else -1
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._max_so_far.append(max(previous, segment.max_timestamp))

    def drop_before(self, offset: int) -> None:
        """Forget the segments that end before ``offset`` (deleted by retention)."""
        kept = [s for s in self._segments if s.last_offset >= offset]
        self._segments, self._bases, self._max_so_far = [], [], []
        for segment in kept:
            self.add(segment)

    def find(self, offset: int) -> SegmentRecord | None:
        """The segment holding ``offset``, if one does."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        segment = self._segments[i]
        return segment if offset <= segment.last_offset else None

    def following(self, segment: SegmentRecord, count: int) -> list[SegmentRecord]:
        """Up to ``count`` segments after ``segment``."""
        i = bisect.bisect_right(self._bases, segment.base_offset)
        return self._segments[i : i + count]

    def first_reaching(self, timestamp: int) -> SegmentRecord | None:
        """The first segment (by offset) holding a record with a timestamp >= ``timestamp``."""
        i = bisect.bisect_left(self._max_so_far, timestamp)
        return self._segments[i] if i < len(self._segments) else None

    def max_timestamp(self) -> SegmentRecord | None:
        """The first segment holding the partition's largest timestamp."""
        if not self._segments:
            return None
        return self.first_reaching(self._max_so_far[-1])

    @property
    def first_offset(self) -> int | None:
        return self._bases[0] if self._bases else None
