"""The commit planner of write-ahead objects: verdicts per chunk and the transactions' shape."""

from __future__ import annotations

import math
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.coordinator.commit_plan import (
    CommitPlan,
    CommitState,
    Limits,
    Outcome,
    Stored,
    plan_commit,
    touched,
    wal_record_key,
)
from kafscale.ipc.write_path import ANY_EPOCH, CommitObject, ObjectChunk
from kafscale.metadata import records
from kafscale.metadata.records import (
    Keys,
    LeaderRecord,
    PartitionRecord,
    SegmentRecord,
    TopicRecord,
    WalRecord,
)
from kafscale.storage import wal

KEYS = Keys("ns")
OBJECT = wal.object_key("ns", 1, "0123456789abcdef", 7)
TOPIC_IDS = {name: str(uuid.UUID(int=n + 1)) for n, name in enumerate(["a", "b", "c"])}
LIMITS = Limits(max_ops=128, max_bytes=1024 * 1024)


def chunk(
    topic: str, partition: int, base: int, last: int, topic_id: str = "", epoch: int = 0
) -> ObjectChunk:
    return ObjectChunk(
        topic=topic,
        topic_id=topic_id or TOPIC_IDS[topic],
        partition=partition,
        chunk=SegmentRecord(
            base_offset=base,
            last_offset=last,
            size=100,
            index_size=0,
            records=last - base + 1,
            max_timestamp=5,
            created_ms=6,
            object=OBJECT,
            position=32,
            codec=0,
        ),
        producers={9: (0, 1, [(0, 0, base, last)])},
        leader_epoch=epoch,
    )


def request(chunks: list[ObjectChunk]) -> CommitObject:
    entries = [(c.topic, c.partition, c.chunk.base_offset) for c in chunks]
    return CommitObject(
        wal=WalRecord(key=OBJECT, size=1000, created_ms=1, broker_id=1, entries=entries),
        chunks=chunks,
    )


def leader(epoch: int = 0, owner: int = 1) -> LeaderRecord:
    return LeaderRecord(owner=owner, epoch=epoch, lease=5, run_id="run")


def topic(name: str, partitions: int = 1000, revision: int = 3) -> Stored[TopicRecord]:
    return Stored(TopicRecord(name, TOPIC_IDS[name], partitions), revision)


def state(
    partitions: dict[tuple[str, int], PartitionRecord] | None = None,
    topics: dict[str, Stored[TopicRecord] | None] | None = None,
) -> CommitState:
    """The records, and broker 1's leader record of every partition whose record says broker 1
    owns it (as a claim leaves them)."""
    partitions = partitions or {}
    return CommitState(
        topics if topics is not None else {name: topic(name) for name in TOPIC_IDS},
        {pid: Stored(record, 40 + pid[1]) for pid, record in partitions.items()},
        {pid: leader(r.leader_epoch) for pid, r in partitions.items() if r.owner == 1},
    )


def claimed(commit: CommitObject) -> dict[tuple[str, int], PartitionRecord]:
    """A fresh record (high watermark 0), claimed by broker 1, of every partition of ``commit``."""
    return {(c.topic, c.partition): at(c.topic, 0) for c in commit.chunks}


def at(topic: str, high_watermark: int, **fields: int) -> PartitionRecord:
    fields.setdefault("owner", 1)
    return PartitionRecord(TOPIC_IDS[topic], high_watermark, **fields)  # type: ignore[arg-type]


def outcomes(plan: CommitPlan) -> list[tuple[Outcome, int]]:
    return [(v.outcome, v.high_watermark) for v in plan.verdicts]


def test_a_partition_commits_with_its_record_and_the_wal_record() -> None:
    commit = request([chunk("a", 0, 10, 19, epoch=2), chunk("a", 0, 20, 24, epoch=2)])
    current = state({("a", 0): at("a", 10, log_start_offset=4, owner=1, leader_epoch=2)})
    plan = plan_commit(commit, current, LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.COMMIT, 25), (Outcome.COMMIT, 25)]
    (txn,) = plan.transactions
    assert [(c.key, c.mod_revision, c.value) for c in txn.compares] == [
        (KEYS.topic("a"), 3, None),
        (KEYS.partition("a", 0), 40, None),
        (KEYS.leader("a", 0), None, records.encode(leader(2))),  # the fence
    ]
    assert [p.key for p in txn.puts] == [
        KEYS.wal_object(f"1/0123456789abcdef/{7:010d}"),
        KEYS.partition("a", 0),
        KEYS.segment("a", 0, 10),
        KEYS.segment("a", 0, 20),
    ]
    assert txn.puts[0].key == wal_record_key(KEYS, OBJECT)
    assert records.decode_wal(txn.puts[0].value) == commit.wal
    written = records.decode_partition(txn.puts[1].value)
    assert written == PartitionRecord(
        TOPIC_IDS["a"],
        25,
        4,
        {9: (0, 1, [(0, 0, 20, 24)])},
        owner=1,
        leader_epoch=2,
        wal_committed=True,
    )  # owner, epoch (and epoch history) as the claim left them
    assert txn.partitions == {("a", 0): written}
    assert records.decode_segment(txn.puts[3].value) == commit.chunks[1].chunk
    assert (txn.chunks, txn.holds_wal, plan.oversized) == ([0, 1], True, [])


def test_a_partition_never_claimed_is_fenced() -> None:
    plan = plan_commit(request([chunk("b", 3, 0, 4)]), state(), LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.REFUSED, 0)]
    assert "does not own b/3" in (plan.verdicts[0].error or "")


def test_entries_below_the_high_watermark_are_answered_committed() -> None:
    commit = request([chunk("a", 0, 0, 9), chunk("a", 0, 10, 14), chunk("a", 0, 15, 19)])
    plan = plan_commit(commit, state({("a", 0): at("a", 15)}), LIMITS, KEYS)
    assert outcomes(plan) == [
        (Outcome.COMMITTED, 15),
        (Outcome.COMMITTED, 15),
        (Outcome.COMMIT, 20),
    ]
    assert plan.transactions[0].chunks == [2]
    everything = plan_commit(commit, state({("a", 0): at("a", 20)}), LIMITS, KEYS)
    assert {v.outcome for v in everything.verdicts} == {Outcome.COMMITTED}
    assert everything.transactions == []


def test_a_gap_or_an_overlap_is_refused_with_everything_after_it() -> None:
    commit = request([chunk("a", 0, 12, 19), chunk("a", 0, 20, 29), chunk("a", 1, 5, 9)])
    plan = plan_commit(commit, state({("a", 0): at("a", 10), ("a", 1): at("a", 7)}), LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.REFUSED, 10), (Outcome.REFUSED, 10), (Outcome.REFUSED, 7)]
    assert "next offset 10" in (plan.verdicts[0].error or "")
    assert plan.transactions == []


def test_chunks_are_taken_in_offset_order_and_verdicts_in_request_order() -> None:
    commit = request([chunk("b", 0, 5, 9), chunk("a", 0, 0, 4), chunk("b", 0, 0, 4)])
    plan = plan_commit(commit, state(claimed(commit)), LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.COMMIT, 10), (Outcome.COMMIT, 5), (Outcome.COMMIT, 10)]
    assert plan.transactions[0].chunks == [1, 2, 0]


def test_a_deleted_or_recreated_topic_is_gone() -> None:
    commit = request([chunk("a", 0, 0, 4), chunk("b", 0, 0, 4), chunk("c", 0, 0, 4)])
    recreated = Stored(TopicRecord("b", str(uuid.uuid4()), 1), 9)
    current = CommitState(
        {"a": None, "b": recreated, "c": topic("c")},
        {("c", 0): Stored(PartitionRecord(str(uuid.uuid4()), 3), 8)},
    )
    plan = plan_commit(commit, current, LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.TOPIC_GONE, -1)] * 3
    assert plan.transactions == []


def test_a_partition_the_topic_does_not_have_is_refused() -> None:
    commit = request([chunk("a", 2, 0, 4)])
    current = state(claimed(commit), topics={"a": topic("a", partitions=2)})
    plan = plan_commit(commit, current, LIMITS, KEYS)
    assert outcomes(plan) == [(Outcome.REFUSED, 0)]
    assert "no partition 2" in (plan.verdicts[0].error or "")


def test_only_our_leader_record_at_the_records_epoch_commits() -> None:
    chunks = [chunk("a", 0, 10, 19, epoch=2)]
    ours = {("a", 0): leader(2)}
    cases = {
        (1, 2): (Outcome.COMMIT, 20),
        (2, 3): (Outcome.REFUSED, 10),  # broker 2 claimed it since
        (1, 3): (Outcome.REFUSED, 10),  # we claimed it again since: another epoch
        (-1, 0): (Outcome.REFUSED, 10),  # nobody claimed it
    }
    for (owner, epoch), expected in cases.items():
        record = {("a", 0): Stored(at("a", 10, owner=owner, leader_epoch=epoch), 40)}
        current = CommitState(state().topics, record, ours)
        plan = plan_commit(request(chunks), current, LIMITS, KEYS)
        assert outcomes(plan) == [expected], (owner, epoch)
        if expected[0] is Outcome.REFUSED:
            assert (plan.verdicts[0].error or "").startswith("fenced")
    # the record says we own it, but we hold no leader record for it (our lease is gone)
    record = {("a", 0): Stored(at("a", 10, leader_epoch=2), 40)}
    not_ours = plan_commit(request(chunks), CommitState(state().topics, record, {}), LIMITS, KEYS)
    assert outcomes(not_ours) == [(Outcome.REFUSED, 10)]


def test_a_chunk_appended_at_another_epoch_is_fenced() -> None:
    current = state({("a", 0): at("a", 10, leader_epoch=2)})
    stale = plan_commit(request([chunk("a", 0, 10, 19, epoch=1)]), current, LIMITS, KEYS)
    assert outcomes(stale) == [(Outcome.REFUSED, 10)]
    assert "appended at leader epoch 1" in (stale.verdicts[0].error or "")
    recovered = request([chunk("a", 0, 10, 19, epoch=ANY_EPOCH)])
    assert outcomes(plan_commit(recovered, current, LIMITS, KEYS)) == [(Outcome.COMMIT, 20)]


def test_what_an_earlier_attempt_committed_is_answered_committed_even_if_fenced_now() -> None:
    current = state({("a", 0): at("a", 20, owner=2)})
    assert outcomes(plan_commit(request([chunk("a", 0, 10, 19)]), current, LIMITS, KEYS)) == [
        (Outcome.COMMITTED, 20)
    ]


def test_300_partitions_split_at_max_ops() -> None:
    commit = request([chunk("a", p, 0, 9) for p in range(300)])
    plan = plan_commit(commit, state(claimed(commit)), LIMITS, KEYS)
    # puts: the WalRecord + 2 per partition (63 in the first), then 2 per partition (64);
    # compares: the topic + 2 per partition (record, leader key), at most 127
    assert [len(txn.partitions) for txn in plan.transactions] == [63, 63, 63, 63, 48]
    assert len(plan.transactions) == 1 + math.ceil((300 - 63) / 63)
    assert max(txn.ops for txn in plan.transactions) == 127
    assert [txn.holds_wal for txn in plan.transactions] == [True] + [False] * 4
    # each transaction compares the topic record once
    for txn in plan.transactions:
        assert [c.key for c in txn.compares].count(KEYS.topic("a")) == 1
    without_wal = plan_commit(commit, state(claimed(commit)), LIMITS, KEYS, include_wal=False)
    assert [len(txn.partitions) for txn in without_wal.transactions] == [63, 63, 63, 63, 48]


def test_split_at_max_bytes() -> None:
    commit = request([chunk("a", p, 0, 9) for p in range(20)])
    limits = Limits(max_ops=128, max_bytes=4000)
    plan = plan_commit(commit, state(claimed(commit)), limits, KEYS)
    assert len(plan.transactions) > 1
    assert all(txn.size <= 4000 for txn in plan.transactions)
    assert sum(len(txn.chunks) for txn in plan.transactions) == 20


def test_a_partition_too_big_for_a_transaction_is_put_alone() -> None:
    big = [chunk("a", 1, base, base) for base in range(200)]
    commit = request([chunk("a", 0, 0, 0), *big, chunk("a", 2, 0, 0)])
    plan = plan_commit(commit, state(claimed(commit)), LIMITS, KEYS)
    assert [list(txn.partitions) for txn in plan.transactions] == [
        [("a", 0)],
        [("a", 1)],
        [("a", 2)],
    ]
    assert plan.oversized == [("a", 1)]
    assert plan.transactions[1].ops == 201


def test_touched() -> None:
    commit = request([chunk("a", 0, 0, 4), chunk("b", 1, 0, 4), chunk("a", 0, 5, 9)])
    assert touched(commit) == ({"a", "b"}, {("a", 0), ("b", 1)})


# -- properties ---------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[CommitObject, CommitState, Limits]:
    """Up to 3 topics x 6 partitions, each with a few chunks around its high watermark."""
    chunks: list[ObjectChunk] = []
    partitions: dict[tuple[str, int], PartitionRecord] = {}
    topics: dict[str, Stored[TopicRecord] | None] = {}
    for name in draw(st.lists(st.sampled_from(sorted(TOPIC_IDS)), unique=True, max_size=3)):
        topics[name] = draw(st.sampled_from([topic(name), topic(name, partitions=4), None]))
        for p in draw(st.lists(st.integers(0, 5), unique=True, max_size=6)):
            hw = draw(st.integers(0, 30))
            if draw(st.booleans()) or hw:
                partitions[(name, p)] = at(name, hw, owner=draw(st.sampled_from([-1, 1, 1, 2])))
            base = draw(st.integers(0, 40))
            for _ in range(draw(st.integers(1, 12))):
                last = base + draw(st.integers(0, 5))
                chunks.append(chunk(name, p, base, last))
                base = last + 1 + draw(st.sampled_from([0, 0, 0, 1]))
    order = draw(st.permutations(range(len(chunks))))
    limits = Limits(draw(st.integers(8, 40)), draw(st.integers(1500, 8000)))
    return request([chunks[i] for i in order]), state(partitions, topics), limits


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plan_properties(scenario: tuple[CommitObject, CommitState, Limits]) -> None:
    commit, current, limits = scenario
    plan = plan_commit(commit, current, limits, KEYS)
    assert len(plan.verdicts) == len(commit.chunks)
    planned = [index for txn in plan.transactions for index in txn.chunks]
    committing = [i for i, v in enumerate(plan.verdicts) if v.outcome is Outcome.COMMIT]
    assert sorted(planned) == committing  # every committing chunk in exactly one transaction
    order = [
        (commit.chunks[i].topic, commit.chunks[i].partition, commit.chunks[i].chunk.base_offset)
        for i in planned
    ]
    assert order == sorted(order)  # (topic, partition, base offset) order, across transactions
    seen: set[tuple[str, int]] = set()
    for number, txn in enumerate(plan.transactions):
        assert txn.holds_wal == (number == 0)
        assert not seen & set(txn.partitions)  # a partition never spans two transactions
        seen |= set(txn.partitions)
        within = txn.ops <= limits.max_ops and txn.size <= limits.max_bytes
        assert within or (len(txn.partitions) == 1 and set(txn.partitions) <= set(plan.oversized))
        assert len(txn.puts) == txn.holds_wal + len(txn.partitions) + len(txn.chunks)
        topics_in = len({t for t, _ in txn.partitions})
        assert len(txn.compares) == 2 * len(txn.partitions) + topics_in
    for index, verdict in enumerate(plan.verdicts):
        entry = commit.chunks[index]
        hw_now = current.partitions.get((entry.topic, entry.partition))
        committed = hw_now.record.high_watermark if hw_now else 0
        if verdict.outcome is Outcome.COMMIT:
            assert entry.chunk.base_offset >= committed
            assert verdict.high_watermark > entry.chunk.last_offset
        elif verdict.outcome is Outcome.COMMITTED:
            assert entry.chunk.last_offset < committed == verdict.high_watermark
        elif verdict.outcome is Outcome.TOPIC_GONE:
            assert current.topics.get(entry.topic) is None
        else:
            assert verdict.error and verdict.high_watermark == committed
