"""The KIP-848 server-side assignors: exactly-once coverage, balance, stickiness, range's
co-partitioning, and results that depend on the inputs' values only."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.coordinator.consumer_groups.assignors import (
    ASSIGNORS,
    MemberSpec,
    Partitions,
    assign,
)

TOPIC_IDS = [str(uuid.UUID(int=random.Random(i).getrandbits(128))) for i in range(5)]
MISSING = str(uuid.UUID(int=2**127 + 1))  # subscribed to, but not in ``topics``
T1, T2, T3, T4, T5 = sorted(TOPIC_IDS)

Members = dict[str, MemberSpec]
Topics = dict[str, int]
Result = dict[str, Partitions]

member_ids = st.lists(st.text("abcxyz019-", min_size=1, max_size=6), max_size=8, unique=True)
topic_counts = st.dictionaries(st.sampled_from(TOPIC_IDS), st.integers(0, 13), max_size=5)
subscriptions = st.frozensets(st.sampled_from([*TOPIC_IDS, MISSING]), max_size=4)
stale_current = st.dictionaries(
    st.sampled_from([*TOPIC_IDS, MISSING]), st.frozensets(st.integers(-2, 16), max_size=6)
)


@st.composite
def groups(draw: st.DrawFn, homogeneous: bool = False, overlapping: bool = True) -> tuple:
    """Members and topics. ``overlapping``: current targets are arbitrary (stale, out of range,
    one partition in two members); otherwise each partition is in one current target at most
    (as the assignors' own results are), still with stale entries."""
    ids = draw(member_ids)
    topics = draw(topic_counts)
    shared = draw(subscriptions)
    subscribed = {m: shared if homogeneous else draw(subscriptions) for m in ids}
    if overlapping:
        current = {m: draw(stale_current) for m in ids}
    else:
        owned: dict[str, dict[str, set[int]]] = {m: {} for m in ids}
        for topic in [*TOPIC_IDS, MISSING]:
            for p in range(topics.get(topic, 0) + 2):
                owner = draw(st.sampled_from([None, *ids]))
                if owner is not None:
                    owned[owner].setdefault(topic, set()).add(p)
        current = {m: {t: frozenset(ps) for t, ps in owned[m].items()} for m in ids}
    return {m: MemberSpec(subscribed[m], current[m]) for m in ids}, topics


def valid(members: Mapping[str, MemberSpec], topics: Topics, member: str) -> set[tuple[str, int]]:
    """A member's current partitions that still exist and that it still subscribes to."""
    spec = members[member]
    return {
        (t, p)
        for t, ps in spec.current.items()
        for p in ps
        if t in spec.subscribed and 0 <= p < topics.get(t, 0)
    }


def flat(partitions: Partitions) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in partitions.items() for p in ps}


def sizes(result: Result) -> dict[str, int]:
    return {m: len(flat(ps)) for m, ps in result.items()}


def assert_covers_exactly_once(result: Result, members: Members, topics: Topics) -> None:
    assert set(result) == set(members)
    subscribed = {t for spec in members.values() for t in spec.subscribed}
    wanted = Counter((t, p) for t in subscribed for p in range(topics.get(t, 0)))
    got = Counter(tp for partitions in result.values() for tp in flat(partitions))
    assert got == wanted
    for member, partitions in result.items():
        for topic, ps in partitions.items():
            assert ps and isinstance(ps, frozenset), (member, topic)
            assert topic in members[member].subscribed, (member, topic)


def with_current(members: Members, result: Result) -> Members:
    return {m: MemberSpec(spec.subscribed, result.get(m, {})) for m, spec in members.items()}


# Properties of both assignors


@settings(max_examples=150, deadline=None)
@given(group=groups(), assignor=st.sampled_from(ASSIGNORS))
def test_each_subscribed_partition_goes_to_exactly_one_of_its_subscribers(group, assignor):
    members, topics = group
    assert_covers_exactly_once(assign(assignor, members, topics), members, topics)


@settings(max_examples=100, deadline=None)
@given(group=groups(), assignor=st.sampled_from(ASSIGNORS))
def test_an_assignment_fed_back_stays_as_it_is(group, assignor):
    members, topics = group
    first = assign(assignor, members, topics)
    assert assign(assignor, with_current(members, first), topics) == first


@settings(max_examples=100, deadline=None)
@given(group=groups(), assignor=st.sampled_from(ASSIGNORS), seed=st.integers(0, 2**32))
def test_the_result_depends_on_values_not_on_insertion_order(group, assignor, seed):
    members, topics = group
    rng = random.Random(seed)

    def shuffled(mapping: Mapping) -> dict:
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    reordered = {
        m: MemberSpec(frozenset(shuffled(dict.fromkeys(s.subscribed))), shuffled(s.current))
        for m, s in shuffled(members).items()
    }
    assert assign(assignor, reordered, shuffled(topics)) == assign(assignor, members, topics)


@pytest.mark.parametrize("name", ["sticky", "Uniform", "", "cooperative-sticky"])
def test_an_unknown_assignor_is_refused(name):
    with pytest.raises(ValueError, match="unknown assignor"):
        assign(name, {"a": MemberSpec(frozenset([T1]), {})}, {T1: 3})


def test_the_default_is_uniform_then_range():
    assert ASSIGNORS == ("uniform", "range")


# uniform, homogeneous subscriptions


@settings(max_examples=150, deadline=None)
@given(group=groups(homogeneous=True))
def test_uniform_homogeneous_sizes_differ_by_one_at_most(group):
    members, topics = group
    counts = sizes(assign("uniform", members, topics)).values()
    assert not counts or max(counts) - min(counts) <= 1


@settings(max_examples=150, deadline=None)
@given(group=groups(homogeneous=True, overlapping=False))
def test_uniform_homogeneous_keeps_all_that_balance_allows(group):
    members, topics = group
    result = assign("uniform", members, topics)
    if not members:
        return
    total = sum(sizes(result).values())
    base, extras = divmod(total, len(members))
    held = {m: len(valid(members, topics, m)) for m in members}
    kept = {m: len(flat(result[m]) & valid(members, topics, m)) for m in members}
    for m in members:
        assert kept[m] == min(held[m], len(flat(result[m]))), m
    # The extra slots went to members that hold more than the base quota, as far as they go.
    best = sum(min(h, base) for h in held.values()) + min(
        extras, sum(h > base for h in held.values())
    )
    assert sum(kept.values()) == best


@settings(max_examples=100, deadline=None)
@given(group=groups(homogeneous=True), newcomer=st.text("abcxyz019-", min_size=7, max_size=7))
def test_uniform_a_joining_member_takes_its_share_from_the_others_and_nothing_else_moves(
    group, newcomer
):
    members, topics = group
    before = assign("uniform", members, topics)
    subscribed = next(iter(members.values())).subscribed if members else frozenset()
    joined = {**with_current(members, before), newcomer: MemberSpec(subscribed, {})}
    after = assign("uniform", joined, topics)
    for m in members:
        assert flat(after[m]) <= flat(before[m]), m


@settings(max_examples=100, deadline=None)
@given(group=groups(homogeneous=True), data=st.data())
def test_uniform_a_leaving_member_spreads_only_its_own_partitions(group, data):
    members, topics = group
    if not members:
        return
    before = assign("uniform", members, topics)
    leaver = data.draw(st.sampled_from(sorted(members)))
    rest = {m: s for m, s in with_current(members, before).items() if m != leaver}
    after = assign("uniform", rest, topics)
    for m in rest:
        assert flat(before[m]) <= flat(after[m]), m


# uniform, heterogeneous subscriptions


@settings(max_examples=150, deadline=None)
@given(group=groups())
def test_uniform_no_partition_of_a_topic_could_move_to_a_subscriber_with_two_fewer(group):
    members, topics = group
    result = assign("uniform", members, topics)
    size = sizes(result)
    for topic in topics:
        subscribers = [m for m in members if topic in members[m].subscribed]
        holders = [m for m in subscribers if result[m].get(topic)]
        for holder in holders:
            assert all(size[holder] - size[m] <= 1 for m in subscribers), (topic, holder, size)


# range


@settings(max_examples=150, deadline=None)
@given(group=groups())
def test_range_quotas_go_by_member_id_and_each_keeps_its_lowest_current_partitions(group):
    members, topics = group
    result = assign("range", members, topics)
    for topic, count in topics.items():
        subscribers = sorted(m for m in members if topic in members[m].subscribed)
        for i, m in enumerate(subscribers):
            base, extras = divmod(count, len(subscribers))
            quota = base + (i < extras)
            assert len(result[m].get(topic, ())) == quota, (topic, m)
            # What it keeps is a prefix of its valid current partitions (the lowest-numbered),
            # less those an earlier member claimed too.
            mine = sorted(p for t, p in valid(members, topics, m) if t == topic)
            claimed_before = {
                p for o in subscribers[:i] for t, p in valid(members, topics, o) if t == topic
            }
            eligible = [p for p in mine if p not in claimed_before]
            assert set(eligible[:quota]) <= result[m].get(topic, frozenset()), (topic, m)


@settings(max_examples=100, deadline=None)
@given(
    ids=member_ids.filter(bool),
    count=st.integers(0, 20),
    others=st.frozensets(st.sampled_from([T4, T5]), max_size=2),
)
def test_range_without_history_gives_co_partitioned_topics_the_same_ranges(ids, count, others):
    members = {m: MemberSpec(frozenset([T1, T2, *others]), {}) for m in ids}
    result = assign("range", members, {T1: count, T2: count, **dict.fromkeys(others, 3)})
    start = 0
    for m in sorted(ids):
        assert result[m].get(T1) == result[m].get(T2)
        got = sorted(result[m].get(T1, ()))
        assert got == list(range(start, start + len(got))), (m, got)
        start += len(got)
    assert start == count


# Examples


def specs(subscribed: list[str], **current: Partitions) -> Members:
    return {m: MemberSpec(frozenset(subscribed), current.get(m, {})) for m in ["a", "b", "c"]}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_three_members_six_partitions(assignor):
    result = assign(assignor, specs([T1]), {T1: 6})
    assert result == {
        "a": {T1: frozenset({0, 1})},
        "b": {T1: frozenset({2, 3})},
        "c": {T1: frozenset({4, 5})},
    }


def test_range_lines_up_two_topics_of_seven():
    result = assign("range", specs([T1, T2]), {T1: 7, T2: 7})
    assert result["a"] == {T1: frozenset({0, 1, 2}), T2: frozenset({0, 1, 2})}
    assert result["b"] == {T1: frozenset({3, 4}), T2: frozenset({3, 4})}
    assert result["c"] == {T1: frozenset({5, 6}), T2: frozenset({5, 6})}


def test_uniform_a_fourth_member_takes_four_of_eighteen_and_nothing_else_moves():
    topics = {T1: 9, T2: 9}
    members = specs([T1, T2])
    before = assign("uniform", members, topics)
    assert sizes(before) == {"a": 6, "b": 6, "c": 6}
    joined = {**with_current(members, before), "d": MemberSpec(frozenset([T1, T2]), {})}
    after = assign("uniform", joined, topics)
    assert sizes(after) == {"a": 5, "b": 5, "c": 4, "d": 4}
    moved = {tp for m in "abc" for tp in flat(before[m]) - flat(after[m])}
    assert moved == flat(after["d"])


def test_uniform_a_member_leaving_hands_its_partitions_to_the_others():
    before = {"a": {T1: frozenset({0, 1})}, "b": {T1: frozenset({2, 3})}}
    members = {
        "a": MemberSpec(frozenset([T1]), before["a"]),
        "b": MemberSpec(frozenset([T1]), before["b"]),
    }
    after = assign("uniform", members, {T1: 6})  # "c", which held 4 and 5, left
    assert after == {"a": {T1: frozenset({0, 1, 4})}, "b": {T1: frozenset({2, 3, 5})}}


def test_uniform_heterogeneous_balances_each_topic_among_its_subscribers():
    members = {
        "a": MemberSpec(frozenset([T1]), {}),
        "b": MemberSpec(frozenset([T1, T2]), {}),
        "c": MemberSpec(frozenset([T2]), {}),
    }
    result = assign("uniform", members, {T1: 4, T2: 4})
    assert sizes(result) == {"a": 2, "b": 3, "c": 3}
    assert_covers_exactly_once(result, members, {T1: 4, T2: 4})


def test_uniform_heterogeneous_moves_from_the_most_loaded_only():
    # "a" holds all of T1 and "b" joins T1: "b" gets the highest-numbered half, "c" is untouched.
    members = {
        "a": MemberSpec(frozenset([T1]), {T1: frozenset(range(6))}),
        "b": MemberSpec(frozenset([T1, T2]), {}),
        "c": MemberSpec(frozenset([T2]), {T2: frozenset({0, 1})}),
    }
    result = assign("uniform", members, {T1: 6, T2: 2})
    assert result == {
        "a": {T1: frozenset({0, 1, 2})},
        "b": {T1: frozenset({3, 4, 5})},
        "c": {T2: frozenset({0, 1})},
    }


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_stale_current_entries_are_dropped_and_missing_topics_ignored(assignor):
    members = {
        "a": MemberSpec(
            frozenset([T1, MISSING]),
            {T1: frozenset({0, 7}), T2: frozenset({0}), MISSING: frozenset({0})},
        ),
        "b": MemberSpec(frozenset(), {T1: frozenset({1})}),
    }
    result = assign(assignor, members, {T1: 2, T2: 1, T3: 4})
    assert result == {"a": {T1: frozenset({0, 1})}, "b": {}}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_a_partition_in_two_current_targets_stays_with_the_lower_member_id(assignor):
    members = {
        "b": MemberSpec(frozenset([T1]), {T1: frozenset({0})}),
        "a": MemberSpec(frozenset([T1]), {T1: frozenset({0})}),
    }
    result = assign(assignor, members, {T1: 2})
    assert result == {"a": {T1: frozenset({0})}, "b": {T1: frozenset({1})}}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_no_members_no_assignment(assignor):
    assert assign(assignor, {}, {T1: 3}) == {}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_more_members_than_partitions_leaves_some_empty(assignor):
    members = {m: MemberSpec(frozenset([T1]), {}) for m in "abcd"}
    result = assign(assignor, members, {T1: 2})
    assert result == {"a": {T1: frozenset({0})}, "b": {T1: frozenset({1})}, "c": {}, "d": {}}
