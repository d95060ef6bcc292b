"""The compaction planner: runs from the oldest chunk, contiguous, one codec, bounded by
segment.bytes; the age and memory rules; loads oldest first within the accumulator's bound."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.flusher import compact_plan
from kafscale.flusher.compact_plan import (
    Chunk,
    Limits,
    Load,
    Merge,
    PartitionKey,
    PartitionState,
    Seal,
    first_run,
    plan,
)
from kafscale.metadata.records import SegmentRecord

HOUR = 3_600_000
TOPIC_ID = "6c1a9a8e-3f3e-4a8e-9f43-6d4c8f0a1b2c"


def chunks(
    sizes: Sequence[int],
    held: int | None = None,
    codecs: Sequence[int] | None = None,
    objects: Sequence[str] | None = None,
    created: Sequence[int] | None = None,
) -> tuple[Chunk, ...]:
    """Contiguous chunks of 10 offsets each; the first ``held`` (all by default) are held."""
    out = []
    for i, size in enumerate(sizes):
        record = SegmentRecord(
            base_offset=10 * i,
            last_offset=10 * i + 9,
            size=size,
            index_size=0,
            records=10,
            max_timestamp=1000 + i,
            created_ms=created[i] if created else 1000 + i,
            object=objects[i] if objects else f"o{i:04d}",
            position=32,
            codec=codecs[i] if codecs else 0,
        )
        out.append(Chunk(record, held is None or i < held))
    return tuple(out)


def state(
    name: str, items: tuple[Chunk, ...], segment_bytes: int = 100, paused: bool = False
) -> PartitionState:
    return PartitionState(PartitionKey(name, 0), TOPIC_ID, segment_bytes, items, paused)


def limits(buffer_bytes: int = 10_000, max_jobs: int = 8) -> Limits:
    return Limits(buffer_bytes=buffer_bytes, max_age_ms=HOUR, max_jobs=max_jobs)


NOW = 2000  # every chunk is younger than an hour


def seals(jobs: Sequence[compact_plan.Job]) -> list[Seal]:
    return [job for job in jobs if isinstance(job, Seal)]


def loads(jobs: Sequence[compact_plan.Job]) -> list[Load]:
    return [job for job in jobs if isinstance(job, Load)]


# --- runs ---------------------------------------------------------------------------------------


def test_a_run_stops_before_it_would_pass_segment_bytes() -> None:
    run, closed = first_run(state("t", chunks([40, 40, 40])))
    assert [chunk.size for chunk in run] == [40, 40] and closed


def test_a_run_that_still_fits_is_open() -> None:
    run, closed = first_run(state("t", chunks([40, 40])))
    assert len(run) == 2 and not closed


def test_a_run_reaching_segment_bytes_exactly_is_closed() -> None:
    assert first_run(state("t", chunks([60, 40])))[1]


def test_one_chunk_bigger_than_segment_bytes_is_a_run_of_its_own() -> None:
    run, closed = first_run(state("t", chunks([150, 10])))
    assert [chunk.size for chunk in run] == [150] and closed


def test_a_run_is_cut_before_the_codec_changes() -> None:
    run, closed = first_run(state("t", chunks([10, 10, 10], codecs=[1, 1, 3])))
    assert len(run) == 2 and closed


def test_a_run_is_cut_where_offsets_do_not_continue() -> None:
    items = chunks([10, 10, 10])
    gap = Chunk(SegmentRecord(45, 49, 10, 0, 5, 0, 0, object="x"), True)
    run, closed = first_run(state("t", (*items[:2], gap)))
    assert len(run) == 2 and closed


# --- seals --------------------------------------------------------------------------------------


def test_nothing_to_do_while_runs_are_open_young_and_memory_is_free() -> None:
    assert plan([state("t", chunks([10, 20]))], limits(), NOW) == []


def test_a_closed_run_is_sealed_and_the_rest_waits() -> None:
    jobs = plan([state("t", chunks([50, 50, 30]))], limits(), NOW)
    assert jobs == [Seal(PartitionKey("t", 0), tuple(c.record for c in chunks([50, 50])), "full")]


def test_a_codec_change_closes_the_run_before_it() -> None:
    jobs = plan([state("t", chunks([10, 10], codecs=[0, 4]))], limits(), NOW)
    assert [len(job.chunks) for job in seals(jobs)] == [1]


def test_the_oldest_chunk_past_max_age_seals_the_whole_run() -> None:
    jobs = plan([state("t", chunks([10, 20, 30]))], limits(), 1000 + HOUR)
    assert [(len(job.chunks), job.reason) for job in seals(jobs)] == [(3, "age")]


def test_a_paused_partition_gets_no_job() -> None:
    assert plan([state("t", chunks([50, 50]), paused=True)], limits(), NOW + HOUR) == []


def test_over_the_bound_the_partitions_holding_most_are_sealed_first_until_it_fits() -> None:
    # every partition is near its segment.bytes (>= SEAL_SOON, 9/10): sealed, not merged
    partitions = [
        state("a", chunks([28, 28]), segment_bytes=62),
        state("b", chunks([30, 30]), segment_bytes=62),
        state("c", chunks([29, 29]), segment_bytes=62),
    ]
    jobs = plan(partitions, limits(buffer_bytes=160), NOW)
    assert [(job.key.topic, job.reason) for job in seals(jobs)] == [("b", "memory")]
    jobs = plan(partitions, limits(buffer_bytes=140), NOW)
    assert [job.key.topic for job in seals(jobs)] == ["b", "c"]
    assert not [job for job in jobs if isinstance(job, Merge)]


def test_at_most_max_jobs_loads_and_merges_besides_the_seals() -> None:
    full = [state(f"t{i}", chunks([60, 60])) for i in range(5)]
    assert len(seals(plan(full, limits(max_jobs=3), NOW))) == 5
    lacking = [
        state(f"l{i}", chunks([10, 20], held=0, objects=[f"w{i}", f"x{i}"]), segment_bytes=1000)
        for i in range(5)
    ]
    assert len(plan(lacking, limits(max_jobs=3), NOW + HOUR)) == 3
    jobs = plan(full + lacking, limits(max_jobs=3), NOW + HOUR)
    assert len(seals(jobs)) == 5 and loads(jobs) == []  # seals take the loads' places


def test_at_most_seal_batch_seals() -> None:
    many = [state(f"t{i:03d}", chunks([60, 60])) for i in range(compact_plan.SEAL_BATCH + 5)]
    jobs = plan(many, limits(), NOW)
    assert [job.key.topic for job in jobs] == [f"t{i:03d}" for i in range(compact_plan.SEAL_BATCH)]


# --- sweeps and batches (write-path.md section 11.2) -------------------------------------------


def merged_chunks(sizes: Sequence[int], created: int, objects: Sequence[str]) -> tuple[Chunk, ...]:
    items = chunks(sizes, created=[created] * len(sizes), objects=objects)
    return tuple(Chunk(c.record, held=False, merged=True) for c in items)


def test_once_one_run_is_due_by_age_the_nearly_as_old_are_sealed_with_it() -> None:
    old = state("a", chunks([10], created=[1000]))
    nearly = state("b", chunks([10], created=[1000 + HOUR // 20]))  # 95% of the max age
    young = state("c", chunks([10], created=[1000 + HOUR // 5]))  # 80%
    jobs = plan([young, nearly, old], limits(), 1000 + HOUR)
    assert [(job.key.topic, job.reason) for job in jobs] == [("a", "age"), ("b", "age")]
    assert plan([young, nearly], limits(), 1000 + HOUR) == []  # nothing due: no sweep


def test_a_full_run_starts_no_sweep() -> None:
    full = state("a", chunks([60, 60]))
    nearly = state("b", chunks([10], created=[1000 + HOUR // 20]))
    assert [job.key.topic for job in plan([full, nearly], limits(), 1000 + HOUR - 1)] == ["a"]


def test_a_plans_seals_go_in_key_order_memory_seals_first() -> None:
    aged = [state(name, chunks([10], created=[1000])) for name in ("d", "b", "c")]
    young = [1000 + HOUR - 10] * 2
    near = state("z", chunks([45, 45], created=young), segment_bytes=100)  # SEAL_SOON: memory
    other = state("a", chunks([20, 20], created=young), segment_bytes=10_000)
    jobs = plan([*aged, near, other], limits(buffer_bytes=100), 1000 + HOUR)
    assert [(job.key.topic, job.reason) for job in seals(jobs)] == [
        ("z", "memory"),
        ("b", "age"),
        ("c", "age"),
        ("d", "age"),
    ]


def test_seals_read_at_most_seal_read_bytes_of_merged_chunks_and_at_least_one_seal() -> None:
    partitions = [
        state(f"p{i}", merged_chunks([30, 30], 1000, ["m1", "m2"]) + chunks([5], created=[1500]))
        for i in range(4)
    ]
    bounded = Limits(10_000, HOUR, 8, seal_read_bytes=130)
    assert [job.key.topic for job in plan(partitions, bounded, 1000 + HOUR)] == ["p0", "p1"]
    tiny = Limits(10_000, HOUR, 8, seal_read_bytes=1)
    assert [job.key.topic for job in plan(partitions, tiny, 1000 + HOUR)] == ["p0"]
    held_only = [state(f"h{i}", chunks([60], created=[1000])) for i in range(3)]
    assert len(plan(held_only, tiny, 1000 + HOUR)) == 3  # held bytes are not read


# --- loads --------------------------------------------------------------------------------------


def test_a_run_lacking_bytes_loads_their_objects_oldest_first_before_it_is_sealed() -> None:
    partition = state("t", chunks([10, 20, 30], held=1), segment_bytes=1000)
    jobs = plan([partition], limits(), NOW + HOUR)
    key = PartitionKey("t", 0)
    assert jobs == [Load("o0001", ((key, 10),), 20), Load("o0002", ((key, 20),), 30)]


def test_one_load_per_object_takes_every_partition_chunk_it_continues() -> None:
    objects = ["w1", "w2"]
    a = state("a", chunks([10, 10], held=0, objects=objects), segment_bytes=1000)
    b = state("b", chunks([5, 5], held=0, objects=objects), segment_bytes=1000)
    jobs = plan([a, b], limits(), 1000 + HOUR)
    assert [(job.object, job.size) for job in loads(jobs)] == [("w1", 15), ("w2", 15)]
    assert loads(jobs)[0].chunks == ((a.key, 0), (b.key, 0))


def test_loads_stop_at_the_bound_and_the_held_part_is_not_sealed_while_loads_go_on() -> None:
    partition = state("t", chunks([10, 10, 10, 10], held=1), segment_bytes=1000)
    jobs = plan([partition], limits(buffer_bytes=30), 1000 + HOUR)
    assert [job.object for job in loads(jobs)] == ["o0001", "o0002"] and not seals(jobs)


def test_without_room_to_load_the_held_part_of_the_run_is_sealed() -> None:
    partition = state("t", chunks([20, 20, 20], held=1), segment_bytes=1000)
    jobs = plan([partition], limits(buffer_bytes=30), 1000 + HOUR)
    assert [(len(job.chunks), job.reason) for job in seals(jobs)] == [(1, "age")]


def test_an_empty_accumulator_may_load_one_object_bigger_than_the_bound() -> None:
    partition = state("t", chunks([50, 50], held=0), segment_bytes=1000)
    jobs = plan([partition], limits(buffer_bytes=0), 1000 + HOUR)
    assert jobs == [Load("o0000", ((partition.key, 0),), 50)]


def test_a_paused_object_is_not_loaded() -> None:
    partition = state("t", chunks([10, 10], held=0), segment_bytes=1000)
    assert plan([partition], limits(), 1000 + HOUR, paused_objects={"o0000"}) == []


def test_other_partitions_ride_along_only_while_they_fit() -> None:
    objects = ["w1", "w2"]
    waiting = state("a", chunks([10, 10], held=0, objects=objects), segment_bytes=1000)
    young = state("b", chunks([8, 8], held=0, objects=objects, created=[1000 + HOUR] * 2), 1000)
    jobs = plan([waiting, young], limits(buffer_bytes=25), 1000 + HOUR)
    assert [(job.object, job.chunks) for job in loads(jobs)] == [
        ("w1", ((waiting.key, 0), (young.key, 0))),
    ]


# --- properties ---------------------------------------------------------------------------------


@st.composite
def partitions_and_limits(draw: st.DrawFn) -> tuple[list[PartitionState], Limits, int]:
    count = draw(st.integers(1, 4))
    out = []
    for p in range(count):
        n = draw(st.integers(0, 7))
        sizes = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
        codecs = draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=n, max_size=n))
        steps = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        cycles: list[int] = []
        cycle = 0
        for step in steps:  # a partition's chunks lie in objects of increasing cycles
            cycle += step if cycles else step + p
            cycles.append(cycle)
        items = chunks(
            sizes,
            held=draw(st.integers(0, n)),
            codecs=codecs,
            objects=[f"w{c:04d}" for c in cycles],
            created=[100 * c for c in cycles],
        )
        out.append(
            state(
                f"t{p}",
                items,
                segment_bytes=draw(st.integers(20, 150)),
                paused=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    bound = draw(st.integers(0, 300))
    return (
        out,
        limits(buffer_bytes=bound, max_jobs=draw(st.integers(1, 6))),
        draw(st.integers(0, 1500)),
    )


@settings(max_examples=400, deadline=None)
@given(partitions_and_limits(), st.sets(st.sampled_from([f"w{c:04d}" for c in range(12)])))
def test_every_plan_keeps_the_invariants(
    case: tuple[list[PartitionState], Limits, int], paused_objects: set[str]
) -> None:
    partitions, lim, now = case
    lim = Limits(lim.buffer_bytes, 1000, lim.max_jobs)
    jobs = plan(partitions, lim, now, paused_objects)
    by_key = {p.key: p for p in partitions}
    assert len(jobs) - len(seals(jobs)) <= lim.max_jobs
    assert len(seals(jobs)) <= compact_plan.SEAL_BATCH
    sealed = [job.key for job in seals(jobs)]
    assert len(sealed) == len(set(sealed))
    for seal in seals(jobs):
        partition = by_key[seal.key]
        assert not partition.paused and seal.chunks
        # a run from the oldest chunk, offsets never skipped, one codec, all held, bounded
        assert seal.chunks == tuple(c.record for c in partition.chunks[: len(seal.chunks)])
        assert all(c.held for c in partition.chunks[: len(seal.chunks)])
        for first, second in zip(seal.chunks, seal.chunks[1:], strict=False):
            assert second.base_offset == first.last_offset + 1
        assert len({record.codec for record in seal.chunks}) == 1
        total = sum(record.size for record in seal.chunks)
        assert total <= partition.segment_bytes or len(seal.chunks) == 1
    objects = [job.object for job in loads(jobs)]
    assert len(objects) == len(set(objects)) and not set(objects) & paused_objects
    held = {(p.key, c.record.base_offset) for p in partitions for c in p.chunks if c.held}
    before = sum(c.size for p in partitions for c in p.chunks if c.held)
    added = 0
    for job in loads(jobs):
        size = 0
        for key, base in job.chunks:
            partition = by_key[key]
            i = next(i for i, c in enumerate(partition.chunks) if c.record.base_offset == base)
            chunk = partition.chunks[i]
            assert not partition.paused and chunk.record.object == job.object
            assert (key, base) not in held
            # it continues the partition's held chunks: the accumulator holds runs from the oldest
            assert all((key, c.record.base_offset) in held for c in partition.chunks[:i])
            held.add((key, base))
            size += chunk.size
        assert size == job.size > 0
        added += size
    # (the state given may already hold more than the bound: then nothing is loaded)
    assert added == 0 or before + added <= lim.buffer_bytes or (before == 0 and len(objects) == 1)


@settings(max_examples=200, deadline=None)
@given(partitions_and_limits())
def test_aged_and_full_runs_that_are_held_are_sealed(
    case: tuple[list[PartitionState], Limits, int],
) -> None:
    partitions, lim, now = case
    lim = Limits(10**9, 1000, 100)
    jobs = plan(partitions, lim, now)
    sealed = {job.key: job for job in seals(jobs)}
    # a sweep: once one run (held or not) is due by age, runs 9/10 as old are due too
    sweep = any(
        not p.paused and p.chunks and not first_run(p)[1]
        and now - p.chunks[0].record.created_ms >= lim.max_age_ms
        for p in partitions
    )  # fmt: skip
    line = lim.max_age_ms * compact_plan.SWEEP_AGE if sweep else lim.max_age_ms
    for partition in partitions:
        run, closed = first_run(partition)
        if partition.paused or not run or not all(c.held for c in run):
            continue
        due = closed or now - run[0].record.created_ms >= line
        assert (partition.key in sealed) == due
        if due:
            assert len(sealed[partition.key].chunks) == len(run)


@settings(max_examples=200, deadline=None)
@given(partitions_and_limits())
def test_repeated_plans_compact_everything_within_the_bound(
    case: tuple[list[PartitionState], Limits, int],
) -> None:
    """Every chunk aged: plans carried out one after the other seal every chunk, and the
    accumulator never holds more than the bound (or one load into an empty accumulator)."""
    partitions, lim, _ = case
    current = {
        p.key: PartitionState(p.key, p.topic_id, p.segment_bytes, p.chunks) for p in partitions
    }
    for _ in range(500):
        if not any(p.chunks for p in current.values()):
            return
        jobs = plan(list(current.values()), lim, 10**9)
        assert jobs, "no progress"
        held = sum(c.size for p in current.values() for c in p.chunks if c.held)
        loaded = sum(job.size for job in loads(jobs))
        assert not loaded or held + loaded <= lim.buffer_bytes or held == len(loads(jobs)) - 1 == 0
        for job in jobs:
            if isinstance(job, Seal):
                p = current[job.key]
                current[job.key] = PartitionState(
                    p.key, p.topic_id, p.segment_bytes, p.chunks[len(job.chunks) :]
                )
            elif isinstance(job, Merge):  # each run becomes one chunk of a merged object
                for key, run in job.runs:
                    p = current[key]
                    bases = {c.base_offset for c in run}
                    merged = Chunk(
                        SegmentRecord(
                            run[0].base_offset, run[-1].last_offset, sum(c.size for c in run),
                            0, 1, 0, run[0].created_ms, "merged", 32, run[0].codec,
                        ),
                        held=False,
                        merged=True,
                    )  # fmt: skip
                    rest = [c for c in p.chunks if c.record.base_offset not in bases]
                    ordered = sorted([*rest, merged], key=lambda c: c.record.base_offset)
                    current[key] = PartitionState(
                        p.key, p.topic_id, p.segment_bytes, tuple(ordered)
                    )
            else:
                for key, base in job.chunks:
                    p = current[key]
                    current[key] = PartitionState(
                        p.key,
                        p.topic_id,
                        p.segment_bytes,
                        tuple(
                            Chunk(c.record, c.held or c.record.base_offset == base)
                            for c in p.chunks
                        ),
                    )
    raise AssertionError("did not finish in 500 plans")


# --- the gate before a plan ---------------------------------------------------------------------


def test_the_gate_is_shut_while_runs_are_open_young_and_memory_is_free() -> None:
    young = [state("a", chunks([30, 30])), state("b", chunks([10]))]
    assert not compact_plan.may_have_work(map(compact_plan.summarize, young), limits(), NOW)
    assert plan(young, limits(), NOW) == []


def test_the_gate_opens_for_a_full_run_an_aged_one_a_broken_one_or_memory() -> None:
    full = state("a", chunks([60, 40]))
    aged = state("a", chunks([10], created=[1000]))
    codec = state("a", chunks([10, 10], codecs=[0, 1]))
    for case in (full, codec):
        assert compact_plan.may_have_work([compact_plan.summarize(case)], limits(), NOW)
    assert compact_plan.may_have_work([compact_plan.summarize(aged)], limits(), 1000 + HOUR)
    assert not compact_plan.may_have_work([compact_plan.summarize(aged)], limits(), 999 + HOUR)
    small = [state("a", chunks([30])), state("b", chunks([30]))]
    assert compact_plan.may_have_work(
        map(compact_plan.summarize, small), limits(buffer_bytes=79), NOW
    )
    assert not compact_plan.may_have_work(
        map(compact_plan.summarize, small), limits(buffer_bytes=80), NOW
    )


def test_a_paused_partition_opens_the_gate_only_through_memory() -> None:
    paused = state("a", chunks([60, 40]), paused=True)
    assert not compact_plan.may_have_work([compact_plan.summarize(paused)], limits(), NOW)
    assert compact_plan.may_have_work(
        [compact_plan.summarize(paused)], limits(buffer_bytes=100), NOW
    )


@st.composite
def gated_cases(draw: st.DrawFn) -> tuple[list[PartitionState], Limits, int]:
    """``partitions_and_limits`` with leading merged chunks and gaps in offsets too."""
    partitions, lim, now = draw(partitions_and_limits())
    out = []
    for p in partitions:
        items = list(p.chunks)
        merged = draw(st.integers(0, len(items)))
        gap = draw(st.integers(0, len(items)))
        shifted = []
        for i, c in enumerate(items):
            record = c.record
            if 0 < gap <= i:
                record = SegmentRecord(
                    record.base_offset + 5, record.last_offset + 5, record.size, 0,
                    record.records, record.max_timestamp, record.created_ms, record.object,
                    record.position, record.codec,
                )  # fmt: skip
            if i < merged:
                shifted.append(Chunk(record, held=False, merged=True))
            else:
                shifted.append(Chunk(record, c.held))
        out.append(PartitionState(p.key, p.topic_id, p.segment_bytes, tuple(shifted), p.paused))
    return out, Limits(lim.buffer_bytes, 1000, lim.max_jobs), now


@settings(max_examples=600, deadline=None)
@given(gated_cases(), st.sets(st.sampled_from([f"w{c:04d}" for c in range(12)])))
def test_a_plan_finds_work_only_where_the_gate_is_open(
    case: tuple[list[PartitionState], Limits, int], paused_objects: set[str]
) -> None:
    partitions, lim, now = case
    if plan(partitions, lim, now, paused_objects):
        assert compact_plan.may_have_work(map(compact_plan.summarize, partitions), lim, now)


# --- the chunk bound ----------------------------------------------------------------------------


def test_a_run_of_many_small_chunks_is_closed_at_max_run_chunks() -> None:
    many = state("t", chunks([1] * (compact_plan.MAX_RUN_CHUNKS + 5)), segment_bytes=1 << 30)
    run, closed = first_run(many)
    assert len(run) == compact_plan.MAX_RUN_CHUNKS and closed
    [seal] = seals(plan([many], limits(), NOW))  # young and small, sealed all the same
    assert len(seal.chunks) == compact_plan.MAX_RUN_CHUNKS


def test_the_gate_opens_at_max_run_chunks_and_not_before() -> None:
    for count, opens in (
        (compact_plan.MAX_RUN_CHUNKS - 1, False),
        (compact_plan.MAX_RUN_CHUNKS, True),
    ):
        small = state("t", chunks([1] * count), segment_bytes=1 << 30)
        summary = compact_plan.summarize(small)
        assert summary.chunks == count
        assert compact_plan.may_have_work([summary], limits(), NOW) is opens
        assert bool(plan([small], limits(), NOW)) is opens


def test_the_accumulators_gate_counts_chunks_as_they_come() -> None:
    from kafscale.flusher.compact_state import Accumulator

    acc = Accumulator(1 << 30, 1 << 30)
    key = PartitionKey("t", 0)
    for i, chunk in enumerate(chunks([1] * compact_plan.MAX_RUN_CHUNKS)):
        assert not acc.may_have_work(limits(), NOW, 0.0)  # young, small, fewer chunks
        acc.committed(key, TOPIC_ID, 0, chunk.record, b"x")
        assert i < compact_plan.MAX_RUN_CHUNKS - 1 or acc.may_have_work(limits(), NOW, 0.0)


def test_a_due_run_seals_its_readable_prefix_once_it_is_seal_prefix_chunks_long() -> None:
    """A broker that took a partition over loads its chunks one object each: the loaded part
    of a long run is sealed in steps, so a move that comes first loses no more than a step."""
    step = compact_plan.SEAL_PREFIX_CHUNKS
    count = compact_plan.MAX_RUN_CHUNKS + 10  # closed: due however young
    for held, sealed in ((step - 1, 0), (step, step), (step + 7, step + 7)):
        moved = state("t", chunks([1] * count, held=held), segment_bytes=1 << 30)
        jobs = plan([moved], limits(), NOW)
        assert [len(seal.chunks) for seal in seals(jobs)] == ([sealed] if sealed else [])
        assert [seal.reason for seal in seals(jobs)] == (["full"] if sealed else [])
        # the loads of the rest go on beside it, from the first chunk not held
        first = loads(jobs)[0]
        assert first.chunks == ((moved.key, 10 * held),)


def test_a_short_due_run_waits_for_all_its_chunks() -> None:
    aged = state("t", chunks([1] * 20, held=10), segment_bytes=1 << 30)
    jobs = plan([aged], limits(), NOW + HOUR)
    assert seals(jobs) == [] and len(loads(jobs)) == 8  # max_jobs loads, oldest first
    jobs = plan([state("t", chunks([1] * 20), segment_bytes=1 << 30)], limits(), NOW + HOUR)
    assert [len(seal.chunks) for seal in seals(jobs)] == [20]
