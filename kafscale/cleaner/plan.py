"""Which part of a compacted partition's log the cleaner rewrites, and when: pure
(docs/design/ecosystem.md, section 4.1).

A partition's entries (spec segments and write-ahead chunks, in offset order) are, from its log
start: the *clean* section (segments a cleaning rewrote: ``generation`` > 0; each cleaning
rewrites everything from the log start, so they form a prefix), the *dirty* section (segments
never cleaned whose newest record is at least ``min.compaction.lag.ms`` old), and the rest, not
cleanable yet (chunks, as Kafka's active segment, and younger segments). A partition is due when
its dirty bytes are at least ``min.cleanable.dirty.ratio`` of its clean and dirty bytes, or its
first dirty segment was written ``max.compaction.lag.ms`` ago; the dirtiest go first.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.metadata.records import SegmentRecord


@dataclass(frozen=True, slots=True)
class Settings:
    """A compacted topic's cleaning configs (Kafka's names)."""

    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86_400_000
    segment_bytes: int = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sections:
    clean: list[SegmentRecord]
    dirty: list[SegmentRecord]

    @property
    def clean_bytes(self) -> int:
        return sum(s.size for s in self.clean)

    @property
    def dirty_bytes(self) -> int:
        return sum(s.size for s in self.dirty)

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def sections(
    entries: Sequence[SegmentRecord], log_start_offset: int, settings: Settings, now_ms: int
) -> Sections:
    """The clean and dirty sections of ``entries`` (in offset order). Entries that end below
    the log start are left out (retention deletes them)."""
    live = [e for e in entries if e.last_offset >= log_start_offset]
    at = 0
    while at < len(live) and not live[at].is_chunk and live[at].generation > 0:
        at += 1
    clean = live[:at]
    newest_cleanable = now_ms - settings.min_compaction_lag_ms
    dirty = []
    for entry in live[at:]:
        if entry.is_chunk or entry.generation > 0 or entry.max_timestamp > newest_cleanable:
            break
        dirty.append(entry)
    return Sections(clean, dirty)


def due(found: Sections, settings: Settings, now_ms: int) -> bool:
    """Whether the partition should be cleaned now."""
    if not found.dirty:
        return False
    if found.ratio >= settings.min_cleanable_dirty_ratio:
        return True
    return now_ms - found.dirty[0].created_ms >= settings.max_compaction_lag_ms


def forced(found: Sections, settings: Settings, now_ms: int) -> bool:
    """Due by ``max.compaction.lag.ms`` (whatever the ratio): cleaned before the others."""
    return (
        bool(found.dirty) and now_ms - found.dirty[0].created_ms >= settings.max_compaction_lag_ms
    )


class Grouping:
    """Kafka's ``groupSegmentsBySize``, one source at a time: consecutive sources whose cleaned
    sizes together stay within ``segment_bytes`` become one segment; a source larger than the
    limit is a group of its own."""

    def __init__(self, segment_bytes: int) -> None:
        self.segment_bytes = segment_bytes
        self.total = 0
        self.count = 0

    def starts_group(self, size: int) -> bool:
        """Take the next source (of ``size`` cleaned bytes): whether it begins a new group (the
        one before it is then complete)."""
        new = self.count > 0 and self.total + size > self.segment_bytes
        if new:
            self.total = self.count = 0
        self.total += size
        self.count += 1
        return new


def groups(sizes: Sequence[int], segment_bytes: int) -> list[range]:
    """The groups of consecutive sources (by index) ``Grouping`` makes of ``sizes``."""
    grouping = Grouping(segment_bytes)
    starts = [i for i, size in enumerate(sizes) if grouping.starts_group(size) or i == 0]
    return [range(a, b) for a, b in itertools.pairwise([*starts, len(sizes)])]
