"""KIP-848 server-side assignors, ``uniform`` and ``range``: pure functions from a group's
subscriptions and current targets to its new target assignment.

docs/design/kip848.md, section 5.3. ``assign`` gets every member's subscribed topic ids
(names and regexes already resolved) and its current target, and the topics' partition counts;
it returns every member's new target. A current target may name topics that are gone or no longer
subscribed, or partitions past the topic's count: those are dropped, never kept nor counted.

Both assignors keep these (tests/unit/coordinator/consumer_groups/test_assignors.py holds them):

- **Exactly once**: each partition of a topic some member subscribes to goes to exactly one of its
  subscribers; topics nobody subscribes to (or that do not exist) are left out.
- **Deterministic**: only the inputs' values count. Members, topics and partitions are walked in
  sorted order and ties go to the lower member id; nothing depends on dict or set order, salted
  ``hash`` or chance, and nothing does I/O. A partition that two current targets name (never,
  unless the store is corrupt) stays with the member whose id sorts first.
- **Stable**: given its own result as the current targets, an assignor returns it unchanged.

``uniform`` (Kafka's ``UniformAssignor``), Balance > Stickiness:

- *Homogeneous* (every member subscribes to the same existing topics): with ``P`` partitions and
  ``M`` members, ``P % M`` members may have ``P // M + 1`` and the rest ``P // M``. The extra slots
  go first to members that hold more than ``P // M`` now, so each member keeps ``min(held, quota)``
  of its partitions (lowest topic id and partition first), the most that balance allows. The
  others are handed out in (topic id, partition) order to members below quota, by member id.
- *Heterogeneous*: each member keeps all it holds of topics it still subscribes to. The free
  partitions are handed out a topic at a time (most partitions per subscriber first, as Kafka's
  ``UniformHeterogeneousAssignmentBuilder``), each to the subscriber with the fewest partitions
  overall. Then, round the topics until nothing moves, a topic's partitions move one at a time
  from its most loaded holder to its least loaded subscriber while they differ by two or more.
  So, per topic, no member holding one of its partitions has two more than any of its
  subscribers. Kafka stops after 16 rounds; here the rounds always end, because each move lowers
  the sum of the squared member sizes.

``range`` (Kafka's ``RangeAssignor``): per topic, its subscribers in member id order, the first
``count % n`` with ``count // n + 1`` partitions and the others ``count // n``. Each keeps its
lowest-numbered current partitions of the topic up to its quota, and the rest go in ascending
order to members below quota, in member id order. Topics with the same count and the same
subscribers thus give each member the same partition numbers (co-partitioning, for joins), from
no history or from the one ``range`` made.

Unlike Kafka: no rack awareness (KafScale brokers have no racks to match a member's rack to); a
subscribed topic that does not exist is skipped, not an assignment failure; ``range`` gives a
topic's extra partitions to the first members by id, where Kafka prefers members that already
hold more than ``count // n``: quotas line up across co-partitioned topics whatever the history,
at the cost of up to ``count % n`` more moves per topic when members change.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

TopicId = str  # canonical UUID text
Partitions = dict[TopicId, frozenset[int]]

ASSIGNORS: tuple[str, ...] = ("uniform", "range")  # the names; the first is the default


@dataclass(frozen=True)
class MemberSpec:
    """A member as the assignors see it."""

    subscribed: frozenset[TopicId]  # resolved topic ids; ids not in ``topics`` are ignored
    current: Partitions  # the target the previous run gave it; stale entries are dropped


def assign(
    assignor: str, members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]
) -> dict[str, Partitions]:
    """The new target: every member id of ``members`` -> its partitions (topic id -> partition
    numbers; topics with no partitions for that member are left out, a member with nothing maps
    to ``{}``). ``topics``: topic id -> partition count (partitions ``0..count-1``). Raises
    ValueError for an unknown assignor."""
    build = _BUILDERS.get(assignor)
    if build is None:
        raise ValueError(f"unknown assignor {assignor!r}; supported: {', '.join(ASSIGNORS)}")
    group = _Group.of(members, topics)
    target = build(group) if group.member_ids else {}
    return {
        member: {topic: frozenset(ps) for topic, ps in sorted(target[member].items()) if ps}
        for member in group.member_ids
    }


_Target = dict[str, dict[TopicId, list[int]]]  # member -> topic -> ascending partitions


@dataclass(frozen=True)
class _Group:
    member_ids: tuple[str, ...]  # sorted
    subscriptions: dict[str, tuple[TopicId, ...]]  # existing topics only, sorted
    counts: dict[TopicId, int]  # every topic someone subscribes to, in topic id order
    held: _Target  # the still-valid part of the current targets, each partition once at most

    @classmethod
    def of(cls, members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]) -> _Group:
        member_ids = tuple(sorted(members))
        existing: dict[frozenset[TopicId], tuple[TopicId, ...]] = {}  # members mostly share one
        for spec in members.values():
            if spec.subscribed not in existing:
                ids = (t for t in spec.subscribed if topics.get(t, 0) > 0)
                existing[spec.subscribed] = tuple(sorted(ids))
        subscriptions = {m: existing[members[m].subscribed] for m in member_ids}
        counts = {t: topics[t] for t in sorted({t for s in existing.values() for t in s})}
        claimed: set[tuple[TopicId, int]] = set()
        held: _Target = {}
        for m in member_ids:
            held[m], subscribed = {}, members[m].subscribed
            for t, current in sorted(members[m].current.items()):
                if t not in subscribed or t not in counts:
                    continue
                ps = [p for p in sorted(current) if 0 <= p < counts[t] and (t, p) not in claimed]
                claimed.update((t, p) for p in ps)
                if ps:
                    held[m][t] = ps
        return cls(member_ids, subscriptions, counts, held)

    def subscribers(self) -> dict[TopicId, list[str]]:
        """Each subscribed topic's members, in member id order."""
        result: dict[TopicId, list[str]] = {t: [] for t in self.counts}
        for m in self.member_ids:
            for t in self.subscriptions[m]:
                result[t].append(m)
        return result


def _size(partitions: Mapping[TopicId, list[int]]) -> int:
    return sum(len(ps) for ps in partitions.values())


def _uniform(group: _Group) -> _Target:
    first = group.subscriptions[group.member_ids[0]]
    if all(group.subscriptions[m] == first for m in group.member_ids):
        return _uniform_homogeneous(group)
    return _uniform_heterogeneous(group)


def _uniform_homogeneous(group: _Group) -> _Target:
    members = group.member_ids
    held_count = {m: _size(group.held[m]) for m in members}
    base, extras = divmod(sum(group.counts.values()), len(members))
    quota = dict.fromkeys(members, base)
    # An extra slot given to a member holding more than ``base`` saves a move; to another, none.
    for m in sorted(members, key=lambda m: (held_count[m] <= base, m))[:extras]:
        quota[m] += 1
    target: _Target = {}
    kept: set[tuple[TopicId, int]] = set()
    for m in members:
        target[m], room = {}, quota[m]
        for t, ps in group.held[m].items():
            if room > 0:
                target[m][t] = ps[:room]
                room -= len(target[m][t])
                kept.update((t, p) for p in target[m][t])
    free = ((t, p) for t, n in group.counts.items() for p in range(n) if (t, p) not in kept)
    for m in members:
        for t, p in itertools.islice(free, quota[m] - _size(target[m])):
            bisect.insort(target[m].setdefault(t, []), p)
    return target


def _uniform_heterogeneous(group: _Group) -> _Target:
    target = {m: {t: list(ps) for t, ps in group.held[m].items()} for m in group.member_ids}
    load = {m: _size(target[m]) for m in group.member_ids}
    subscribers = group.subscribers()
    # Kafka's topic order: most partitions per subscriber, then fewest subscribers, then id.
    order = sorted(
        group.counts,
        key=lambda t: (-Fraction(group.counts[t], len(subscribers[t])), len(subscribers[t]), t),
    )
    taken = {(t, p) for m in group.member_ids for t, ps in target[m].items() for p in ps}
    for t in order:
        least_loaded = [(load[m], m) for m in subscribers[t]]
        heapq.heapify(least_loaded)
        for p in range(group.counts[t]):
            if (t, p) not in taken:
                _, m = heapq.heappop(least_loaded)
                bisect.insort(target[m].setdefault(t, []), p)
                load[m] += 1
                heapq.heappush(least_loaded, (load[m], m))
    shared = [t for t in order if len(subscribers[t]) > 1]
    moved = True
    while moved:
        moved = False
        for t in shared:
            if _balance_topic(t, subscribers[t], target, load):
                moved = True
    return target


def _balance_topic(
    topic: TopicId, subscribers: list[str], target: _Target, load: dict[str, int]
) -> bool:
    """Move ``topic``'s partitions, each time the highest-numbered of its most loaded holder, to
    its least loaded subscriber until those differ by one at most. True if any moved.

    Both heaps hold stale entries (a load since changed); they are skipped when they surface, and
    every change pushes the member's new load, so each member always has one current entry."""
    receivers = [(load[m], m) for m in subscribers]
    givers = [(-load[m], m) for m in subscribers if topic in target[m]]
    heapq.heapify(receivers)
    heapq.heapify(givers)
    moved = False
    while givers:
        giver_load, giver = -givers[0][0], givers[0][1]
        if giver_load != load[giver] or topic not in target[giver]:
            heapq.heappop(givers)
            continue
        receiver_load, receiver = receivers[0]
        if receiver_load != load[receiver]:
            heapq.heappop(receivers)
            continue
        if giver_load - receiver_load <= 1:
            break
        partitions = target[giver][topic]
        bisect.insort(target[receiver].setdefault(topic, []), partitions.pop())
        if not partitions:
            del target[giver][topic]
        load[giver] -= 1
        load[receiver] += 1
        for m in (giver, receiver):
            heapq.heappush(receivers, (load[m], m))
            heapq.heappush(givers, (-load[m], m))
        moved = True
    return moved


def _range(group: _Group) -> _Target:
    target: _Target = {m: {} for m in group.member_ids}
    for t, members in group.subscribers().items():
        base, extras = divmod(group.counts[t], len(members))
        quotas = [base + 1] * extras + [base] * (len(members) - extras)
        kept: dict[str, list[int]] = {}
        for m, quota in zip(members, quotas, strict=True):
            if t in group.held[m]:
                kept[m] = group.held[m][t][:quota]
        taken = {p for ps in kept.values() for p in ps}
        free = [p for p in range(group.counts[t]) if p not in taken]
        start = 0
        for m, quota in zip(members, quotas, strict=True):
            keep = kept.get(m, [])
            handed = free[start : start + quota - len(keep)]
            start += len(handed)
            if keep or handed:
                target[m][t] = sorted(keep + handed) if keep else handed
    return target


_BUILDERS: dict[str, Callable[[_Group], _Target]] = {"uniform": _uniform, "range": _range}
assert tuple(_BUILDERS) == ASSIGNORS
