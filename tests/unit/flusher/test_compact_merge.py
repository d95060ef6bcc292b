"""The merge level of compaction: the planner's merge choice, and a property over random
sequences of commits, merges, loads and seals run through the real planner and accumulator
(bytes stand for batches: neither looks inside them)."""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.flusher import compact_plan
from kafscale.flusher.compact_plan import MAX_MERGED, Limits, Load, Merge, PartitionKey, Seal, plan
from kafscale.flusher.compact_state import Accumulator
from kafscale.metadata.records import SegmentRecord
from tests.unit.flusher.test_compact_plan import NOW, chunks, limits, state


def merges(jobs: list) -> list[Merge]:  # type: ignore[type-arg]
    return [job for job in jobs if isinstance(job, Merge)]


def test_over_the_threshold_the_oldest_held_runs_of_far_partitions_merge() -> None:
    # demand 120 > 3/4 of 150; a merge of about half the bound (75), oldest first
    partitions = [
        state(f"p{i}", chunks([10, 10], created=[1000 + i, 1100 + i]), segment_bytes=1000)
        for i in range(6)
    ]
    jobs = plan(partitions, limits(buffer_bytes=150), NOW)
    assert not [job for job in jobs if isinstance(job, Seal)]
    (merge,) = merges(jobs)
    assert [key.topic for key, _ in merge.runs] == ["p0", "p1", "p2", "p3"]
    assert merge.size == 80
    assert all(len(run) == 2 for _, run in merge.runs)
    assert merges(plan(partitions, limits(buffer_bytes=161), NOW)) == []  # under 3/4


def test_a_partition_near_its_segment_bytes_is_sealed_not_merged() -> None:
    near = state("near", chunks([45, 45]), segment_bytes=100)  # 90: SEAL_SOON
    far = state("far", chunks([10, 10]), segment_bytes=1000)
    jobs = plan([near, far], limits(buffer_bytes=100), NOW)
    assert [(job.key.topic, job.reason) for job in jobs if isinstance(job, Seal)] == [
        ("near", "memory")
    ]
    assert [key.topic for job in merges(jobs) for key, _ in job.runs] == ["far"]


def test_merged_chunks_lead_and_a_seal_reads_them_with_the_held_ones() -> None:
    items = chunks([30, 30, 20, 20], held=None)
    items = tuple(type(c)(c.record, held=i >= 2, merged=i < 2) for i, c in enumerate(items))
    partition = state("t", items, segment_bytes=100)
    (seal,) = plan([partition], limits(), NOW)
    assert isinstance(seal, Seal) and seal.reason == "full"
    assert [c.base_offset for c in seal.chunks] == [0, 10, 20, 30]
    # merged chunks are never merged again; only the held run after them
    far = state("t", items, segment_bytes=10_000)
    (merge,) = merges(plan([far], limits(buffer_bytes=50), NOW))
    assert [c.base_offset for _, run in merge.runs for c in run] == [20, 30]


def test_a_partition_with_the_most_merged_chunks_is_sealed() -> None:
    items = chunks([5] * (MAX_MERGED + 1))
    items = tuple(
        type(c)(c.record, held=i == MAX_MERGED, merged=i < MAX_MERGED) for i, c in enumerate(items)
    )
    jobs = plan([state("t", items, segment_bytes=1000)], limits(buffer_bytes=4), NOW)
    assert merges(jobs) == []
    assert [len(job.chunks) for job in jobs if isinstance(job, Seal)] == [MAX_MERGED + 1]


# --- the property: bytes never lost or duplicated ----------------------------------------------

KEYS = [PartitionKey("t", p) for p in range(4)]
TOPIC_ID = "6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c"


class Simulation:
    """The compactor's job loop without I/O: objects are dicts, jobs apply at once."""

    def __init__(self, bound: int, segment_bytes: int) -> None:
        self.acc = Accumulator(bound, segment_bytes)
        self.bound = bound
        self.segment_bytes = segment_bytes
        self.objects: dict[str, dict[int, bytes]] = {}  # object -> position -> chunk bytes
        self.next_offset = dict.fromkeys(KEYS, 0)
        self.committed: dict[PartitionKey, list[bytes]] = defaultdict(list)
        self.segments: dict[PartitionKey, list[tuple[int, int, bytes]]] = defaultdict(list)
        self.seq = itertools.count()
        self.ranged_reads = 0

    def commit(self, sizes: dict[int, int], now: int) -> None:
        """One write-ahead object holding a chunk of each partition in ``sizes``."""
        name = f"w{next(self.seq):04d}"
        self.objects[name] = {}
        for position, (p, size) in enumerate(sorted(sizes.items())):
            key = KEYS[p]
            base = self.next_offset[key]
            data = bytes([p]) * size
            self.next_offset[key] = base + size
            record = SegmentRecord(base, base + size - 1, size, 0, size, now, now, name, position)
            self.objects[name][position] = data
            self.committed[key].append(data)
            self.acc.committed(key, TOPIC_ID, 0, record, data)

    def run(self, limits: Limits, now: int) -> int:
        states, paused = self.acc.states(0.0)
        # The gate the compactor asks before planning: kept up to date as chunks come, it says
        # what walking the chunks says, and is open whenever a plan finds work.
        gate = compact_plan.may_have_work(map(compact_plan.summarize, states), limits, now)
        assert self.acc.may_have_work(limits, now, 0.0) == gate
        jobs = plan(states, limits, now, paused)
        assert gate or not jobs
        for job in jobs:
            if isinstance(job, Merge):
                self.merge(job)
            elif isinstance(job, Seal):
                self.seal(job)
            else:
                self.load(job)
            assert self.acc.held <= self.bound or isinstance(job, Load)
        return len(jobs)

    def merge(self, job: Merge) -> None:
        name = f"m{next(self.seq):04d}"
        self.objects[name] = {}
        self.acc.merged_objects([name])
        for position, (key, _, data) in enumerate(self.acc.merge_input(job)):
            run = dict(job.runs)[key]
            body = b"".join(data)
            self.objects[name][position] = body
            first, last = run[0], run[-1]
            self.acc.merged(
                key,
                SegmentRecord(
                    first.base_offset,
                    last.last_offset,
                    len(body),
                    0,
                    len(body),
                    first.max_timestamp,
                    first.created_ms,
                    name,
                    position,
                ),
            )

    def seal(self, job: Seal) -> None:
        found = self.acc.seal_input(job)
        assert found is not None
        parts = []
        for chunk, data in zip(job.chunks, found[1], strict=True):
            if data is None:
                assert chunk.object.startswith("m")  # only merged chunks are read by range
                self.ranged_reads += 1
                data = self.objects[chunk.object][chunk.position]
            parts.append(data)
        assert sum(1 for c in job.chunks if c.object.startswith("m")) <= MAX_MERGED
        segment = SegmentRecord(
            job.chunks[0].base_offset, job.chunks[-1].last_offset, 0, 0, 0, 0, 0
        )
        self.segments[job.key].append((segment.base_offset, segment.last_offset, b"".join(parts)))
        self.acc.compacted(job.key, segment)

    def load(self, job: Load) -> None:
        assert job.object.startswith("w")  # a merged object is never loaded whole
        found = {}
        for key in {key for key, _ in job.chunks}:
            for chunk in self.acc.uncompacted(key):
                if chunk.object == job.object:
                    data = self.objects[job.object][chunk.position]
                    found[(key, chunk.base_offset)] = (chunk.position, memoryview(data))
        assert self.acc.loaded(job, found) == []


@settings(max_examples=60, deadline=None)
@given(
    cycles=st.lists(
        st.dictionaries(st.integers(0, 3), st.integers(1, 30), min_size=1, max_size=4),
        min_size=1,
        max_size=40,
    ),
    bound=st.integers(40, 200),
    segment_bytes=st.integers(50, 400),
)
def test_the_segments_hold_exactly_the_committed_bytes_in_order(
    cycles: list[dict[int, int]], bound: int, segment_bytes: int
) -> None:
    sim = Simulation(bound, segment_bytes)
    young = Limits(bound, 10**9, 4)
    for now, sizes in enumerate(cycles, start=1000):
        sim.commit(sizes, now)
        for _ in range(20):
            if not sim.run(young, now):
                break
    everything_due = Limits(bound, -(10**9), 4)
    for _ in range(1000):
        if not sim.run(everything_due, 10**6):
            break
    for key in KEYS:
        assert sim.acc.uncompacted(key) == []
        spans = sim.segments[key]
        assert b"".join(data for _, _, data in spans) == b"".join(sim.committed[key])
        for (_, last, _), (base, _, _) in itertools.pairwise(spans):
            assert base == last + 1
    assert sim.acc.held == 0


def test_sparse_partitions_merge_and_seals_read_the_merged_chunks_by_range() -> None:
    sim = Simulation(bound=60, segment_bytes=400)
    young = Limits(60, 10**9, 4)
    for now in range(1000, 1100):
        sim.commit({p: 3 for p in range(4)}, now)
        while sim.run(young, now):
            pass
    assert any(name.startswith("m") for name in sim.objects)
    for key in KEYS:  # 300 bytes each: not sealed yet, but nothing lost
        held = sim.acc.uncompacted(key)
        assert sum(c.size for c in held) + sum(len(d) for _, _, d in sim.segments[key]) == 300
    assert sim.ranged_reads == 0
    # aged: each partition is sealed in one segment, its merged chunks read by range
    while sim.run(Limits(60, 10**9, 4), 2000 + 10**9):
        pass
    assert sim.ranged_reads > 0
    for key in KEYS:
        assert sim.acc.uncompacted(key) == []
        assert b"".join(d for _, _, d in sim.segments[key]) == b"".join(sim.committed[key])


def test_a_partition_reaching_the_most_merged_chunks_is_sealed() -> None:
    sim = Simulation(bound=60, segment_bytes=10_000)
    young = Limits(60, 10**9, 4)
    now = 1000
    while not any(sim.segments.values()):
        sim.commit({p: 3 for p in range(4)}, now)
        while sim.run(young, now):
            pass
        now += 1
        assert now < 2000, "never sealed"
    assert sim.ranged_reads >= MAX_MERGED
