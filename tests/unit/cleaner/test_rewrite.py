"""The log cleaner's rewrite (``kafscale.cleaner.rewrite``) and planner (``kafscale.cleaner.plan``)
as pure functions.

The property: over any history of keyed records, tombstones and keyless records, sealed into
segments and cleaned at any moments, the cleaned log holds exactly Kafka's compacted log -- for
each key its last record, a tombstone until ``delete.retention.ms`` after the cleaning that first
kept it -- and nothing younger than ``min.compaction.lag.ms`` is touched; every record kept has
its offset, key, value, headers and timestamp unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.cleaner import plan
from kafscale.cleaner.rewrite import Cleaning, OffsetMap, clean_batch, clean_segments
from kafscale.metadata.records import SegmentRecord
from kafscale.protocol import records
from kafscale.protocol.compression import Codec
from kafscale.protocol.records import Record, TimestampType

NOW = 1_000_000_000


def batch(
    base: int,
    *items: tuple[bytes | None, bytes | None, int],
    codec: int = Codec.NONE,
    timestamp_type: int = TimestampType.CREATE_TIME,
) -> bytes:
    return records.build_batch(
        [(key, value, (("h", b"1"),), ts) for key, value, ts in items],
        base_offset=base,
        codec=codec,
        producer_id=7,
        producer_epoch=1,
        base_sequence=base,
        timestamp_type=timestamp_type,
        partition_leader_epoch=3,
    )


def read(batches: list[bytes]) -> list[Record]:
    return [r for b in batches for r in records.iter_records(b)]


def cleaning(*seen: tuple[bytes, int], now: int = NOW, delete_retention_ms: int = 100) -> Cleaning:
    offsets = OffsetMap(1 << 20)
    for key, offset in seen:
        offsets.add(key, offset)
    return Cleaning(offsets, now, delete_retention_ms)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_superseded_and_keyless_records_go_and_the_rest_keep_their_offsets(codec: int) -> None:
    original = batch(
        10, (b"a", b"1", 100), (None, b"x", 101), (b"b", b"2", 102), (b"a", b"3", 103), codec=codec
    )
    cleaned = clean_batch(original, cleaning((b"a", 13), (b"b", 12)))
    assert cleaned is not None
    header = records.read_header(cleaned)
    before = records.read_header(original)
    assert (header.base_offset, header.last_offset_delta) == (10, 3)  # offsets never change
    assert header.codec == codec and header.records_count == 2
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 10)
    assert header.partition_leader_epoch == 3 and header.max_timestamp == 103
    assert header.base_timestamp == before.base_timestamp
    assert records.batch_crc(cleaned) == header.crc
    kept = read([cleaned])
    assert [(r.offset, r.key, r.value, r.timestamp) for r in kept] == [
        (12, b"b", b"2", 102),
        (13, b"a", b"3", 103),
    ]
    assert kept[0].headers == (("h", b"1"),)


def test_a_batch_with_nothing_to_drop_comes_back_unchanged_and_an_emptied_one_goes() -> None:
    original = batch(0, (b"a", b"1", 5), (b"b", b"2", 6))
    assert clean_batch(original, cleaning((b"a", 0), (b"b", 1))) == original
    assert clean_batch(original, cleaning((b"a", 9), (b"b", 9))) is None


def test_the_first_cleaning_to_keep_a_tombstone_stamps_its_delete_horizon() -> None:
    original = batch(0, (b"a", None, 500), (b"b", b"v", 400))
    stamped = clean_batch(original, cleaning(now=NOW, delete_retention_ms=100))
    assert stamped is not None
    header = records.read_header(stamped)
    assert header.has_delete_horizon and header.base_timestamp == NOW + 100
    # Record timestamps are unchanged (deltas re-encoded against the horizon).
    assert [(r.offset, r.value, r.timestamp) for r in read([stamped])] == [
        (0, None, 500),
        (1, b"v", 400),
    ]
    # Before the horizon the tombstone stays, the batch untouched; after it, the tombstone goes.
    assert clean_batch(stamped, cleaning(now=NOW + 99)) == stamped
    after = clean_batch(stamped, cleaning(now=NOW + 100))
    assert after is not None
    assert [(r.offset, r.value, r.timestamp) for r in read([after])] == [(1, b"v", 400)]


def test_log_append_time_batches_keep_their_time() -> None:
    original = batch(
        0, (b"a", b"x", 1), (b"b", None, 2), timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    appended = bytearray(original)
    records.set_log_append_time(appended, 0, 777)
    stamped = clean_batch(bytes(appended), cleaning())  # the tombstone's horizon is stamped
    assert stamped is not None and records.read_header(stamped).has_delete_horizon
    assert [(r.offset, r.timestamp) for r in read([stamped])] == [(0, 777), (1, 777)]
    superseded = clean_batch(stamped, cleaning((b"a", 5)))
    assert superseded is not None
    assert [(r.offset, r.timestamp) for r in read([superseded])] == [(1, 777)]
    assert records.read_header(superseded).max_timestamp == 777


def test_control_batches_are_kept_whole() -> None:
    control = records.build_batch([(b"\x00\x00\x00\x00", b"", (), 5)], is_control=True)
    assert clean_batch(control, cleaning((b"\x00\x00\x00\x00", 99))) == control


def test_the_map_stops_at_the_segment_that_fills_it() -> None:
    segments = [
        [batch(0, (b"a", b"1", 1), (b"b", b"1", 1))],
        [batch(2, (b"c", b"1", 1), (b"a", b"2", 1))],
        [batch(4, (b"a", b"3", 1))],
    ]
    offsets = OffsetMap(3 * 128)  # three keys
    cleaned = clean_segments([], segments, offsets, NOW, 100)
    assert len(cleaned) == 2  # the second segment filled the map: the third is not cleaned
    assert [(r.offset, r.key) for r in read(cleaned[0] + cleaned[1])] == [
        (1, b"b"),
        (2, b"c"),
        (3, b"a"),
    ]


# -- the planner --------------------------------------------------------------------------------


def entry(
    base: int, last: int, size: int, max_ts: int, created: int = 0, generation: int = 0
) -> SegmentRecord:
    return SegmentRecord(
        base, last, size, 16, last - base + 1, max_ts, created, generation=generation
    )


def chunk(base: int, last: int) -> SegmentRecord:
    return SegmentRecord(base, last, 10, 0, last - base + 1, NOW, NOW, object="w", position=32)


def test_sections_and_when_a_partition_is_due() -> None:
    log = [
        entry(0, 9, 100, 10, generation=2),
        entry(10, 19, 100, 20, generation=1),
        entry(20, 29, 100, NOW - 5000, created=NOW - 6000),
        entry(30, 39, 100, NOW - 10),  # younger than the minimum lag
        chunk(40, 49),
    ]
    lag = plan.Settings(min_compaction_lag_ms=1000, min_cleanable_dirty_ratio=0.5)
    found = plan.sections(log, 0, lag, NOW)
    assert found.clean == log[:2] and found.dirty == log[2:3]
    assert found.ratio == pytest.approx(1 / 3)
    assert not plan.due(found, lag, NOW)
    assert plan.due(
        found, plan.Settings(min_compaction_lag_ms=1000, min_cleanable_dirty_ratio=0.3), NOW
    )
    forced = plan.Settings(min_compaction_lag_ms=1000, max_compaction_lag_ms=6000)
    assert plan.due(found, forced, NOW) and plan.forced(found, forced, NOW)
    no_lag = plan.sections(log, 0, plan.Settings(), NOW)
    assert no_lag.dirty == log[2:4]  # chunks are never cleanable
    # Entries ending below the log start are left to retention.
    assert plan.sections(log, 10, lag, NOW).clean == log[1:2]
    assert not plan.due(plan.sections(log[:2], 0, lag, NOW), lag, NOW)


def test_cleaned_segments_are_grouped_up_to_segment_bytes() -> None:
    assert plan.groups([40, 40, 40, 100, 10, 10], 100) == [
        range(0, 2),
        range(2, 3),
        range(3, 4),
        range(4, 6),
    ]
    assert plan.groups([300], 100) == [range(0, 1)]
    assert plan.groups([], 100) == []


# -- the property ---------------------------------------------------------------------------------


@dataclass
class Model:
    """A partition's log as segments of batches, cleaned as the cleaner would clean it."""

    settings: plan.Settings
    segments: list[list[bytes]] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    open: list[tuple[bytes | None, bytes | None, int]] = field(default_factory=list)
    produced: list[Record] = field(default_factory=list)
    # Tombstone offset -> the index in ``cleanings`` of the first cleaning that kept it.
    first_kept: dict[int, int] = field(default_factory=dict)
    cleanings: list[int] = field(default_factory=list)  # when each cleaning ran
    now: int = NOW

    def produce(self, key: bytes | None, value: bytes | None) -> None:
        offset = len(self.produced)
        self.produced.append(Record(offset, self.now, key, value))
        self.open.append((key, value, self.now))

    def seal(self) -> None:
        if self.open:
            base = len(self.produced) - len(self.open)
            # Two records a batch: cleaning works on records inside batches.
            batches = [batch(base + i, *self.open[i : i + 2]) for i in range(0, len(self.open), 2)]
            self.segments.append(batches)
            self.generations.append(0)
            self.open = []

    def entries(self) -> list[SegmentRecord]:
        out = []
        for segment, generation in zip(self.segments, self.generations, strict=True):
            found = read(segment)
            headers = [records.read_header(b) for b in segment]
            base = headers[0].base_offset if headers else 0
            last = headers[-1].last_offset if headers else base
            max_ts = max((r.timestamp for r in found), default=0)
            out.append(
                entry(base, last, sum(len(b) for b in segment) + 1, max_ts, generation=generation)
            )
        return out

    def clean(self, map_bytes: int) -> None:
        found = plan.sections(self.entries(), 0, self.settings, self.now)
        if not found.dirty:
            return
        before = [list(s) for s in self.segments]
        self.cleanings.append(self.now)
        clean, dirty = len(found.clean), len(found.dirty)
        cleaned = clean_segments(
            self.segments[:clean],
            self.segments[clean : clean + dirty],
            OffsetMap(map_bytes),
            self.now,
            self.settings.delete_retention_ms,
        )
        for index, batches in enumerate(cleaned):
            for r in read(batches):
                if r.value is None:
                    self.first_kept.setdefault(r.offset, len(self.cleanings) - 1)
            self.segments[index] = batches
            self.generations[index] += 1
        # Segments after the cleaned ones are untouched, and nothing younger than the minimum
        # compaction lag was removed.
        assert self.segments[len(cleaned) :] == before[len(cleaned) :]
        removed = {r.offset: r for s in before for r in read(s)}
        for r in (r for s in self.segments for r in read(s)):
            removed.pop(r.offset, None)
        assert all(
            r.timestamp <= self.now - self.settings.min_compaction_lag_ms for r in removed.values()
        )

    def check(self) -> None:
        log = [r for segment in self.segments for r in read(segment)]
        offsets = [r.offset for r in log]
        assert offsets == sorted(set(offsets))
        produced = {r.offset: r for r in self.produced}
        for r in log:  # every record kept is the one produced at its offset
            p = produced[r.offset]
            assert (r.key, r.value, r.timestamp) == (p.key, p.value, p.timestamp)
        kept = set(offsets)
        last: dict[bytes, Record] = {}
        for r in self.produced:
            if r.key is not None:
                last[r.key] = r
        for key, r in last.items():
            sealed = r.offset < len(self.produced) - len(self.open)
            if not sealed:
                continue
            expired = r.value is None and self.expired(r.offset)
            assert (r.offset in kept) != expired, (key, r, self.first_kept.get(r.offset))

    def expired(self, offset: int) -> bool:
        """Whether the tombstone at ``offset`` was due to go at some cleaning: one that ran at
        or after its delete horizon (stamped by the first cleaning that kept it)."""
        first = self.first_kept.get(offset)
        if first is None:
            return False
        horizon = self.cleanings[first] + self.settings.delete_retention_ms
        return any(c >= horizon for c in self.cleanings[first + 1 :])

    def compacted(self) -> dict[bytes, bytes | None]:
        """Key -> value of the whole log, which must hold each key once."""
        found = [r for segment in self.segments for r in read(segment)]
        keys = [r.key for r in found]
        assert None not in keys and len(keys) == len(set(keys))
        return {r.key: r.value for r in found if r.key is not None}


KEYS = st.sampled_from([b"a", b"b", b"c", b"d", None])
STEP = st.one_of(
    st.tuples(st.just("produce"), KEYS, st.one_of(st.none(), st.binary(max_size=3))),
    st.tuples(st.just("seal"), st.none(), st.none()),
    st.tuples(st.just("clean"), st.none(), st.none()),
    st.tuples(st.just("wait"), st.integers(0, 300), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(STEP, max_size=60),
    delete_retention_ms=st.integers(0, 200),
    min_lag_ms=st.integers(0, 200),
    map_keys=st.integers(1, 6),
)
def test_the_cleaned_log_is_the_last_record_per_key(
    steps: list[tuple[str, object, object]],
    delete_retention_ms: int,
    min_lag_ms: int,
    map_keys: int,
) -> None:
    model = Model(
        plan.Settings(
            min_compaction_lag_ms=min_lag_ms,
            delete_retention_ms=delete_retention_ms,
            min_cleanable_dirty_ratio=0.0,
        )
    )
    for kind, a, b in steps:
        if kind == "produce":
            assert a is None or isinstance(a, bytes)
            assert b is None or isinstance(b, bytes)
            model.produce(a, b)
            model.now += 1
        elif kind == "seal":
            model.seal()
        elif kind == "clean":
            model.clean(map_keys * 128)
        else:
            assert isinstance(a, int)
            model.now += a
        model.check()
    # Sealed, old enough, and cleaned with a map holding every key: Kafka's compacted log.
    model.seal()
    model.now += min_lag_ms + 1
    model.clean(1 << 20)
    model.check()
    expected: dict[bytes, bytes | None] = {}
    for r in model.produced:
        if r.key is not None:
            expected[r.key] = r.value
    for key, value in list(expected.items()):
        offset = max(r.offset for r in model.produced if r.key == key)
        if value is None and model.expired(offset):
            del expected[key]
    assert model.compacted() == expected
