"""Which broker should own each partition: pure, computed alike by every broker (no controller).

docs/design/scale-out.md, section 4. ``target`` takes the running brokers, every partition and
who owns what now, and returns one broker per partition. Brokers that see the same view compute
the same target; while their views differ, etcd's compare-and-set on the leader keys decides.

Invariants (tests/unit/coordinator/test_assignment.py holds them):

- **Balanced per topic**: of a topic's ``n`` partitions every broker gets ``n // B`` or
  ``n // B + 1``.
- **Balanced overall**: broker totals differ by at most one, whatever the topics' sizes (a
  topic's extra partitions go to the brokers with the fewest so far, then a final pass swaps
  extras between topics).
- **Sticky**: a partition stays with a running owner whenever balance allows, so a broker joining
  takes its ``P / B`` share from the others and one leaving gives away its own; per-topic balance
  can force a few more moves between the others, never more than the partitions that had to move
  anyway (usually none: 3,000 partitions on 3 brokers + 1 move exactly 750).
- **Deterministic**: ties are broken by rendezvous scores (CRC32C of topic id, partition and
  broker id), never by dict order or Python's salted ``hash``; the result depends only on the
  inputs' contents.
"""

from __future__ import annotations

import struct
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import crc32c

_SCORE = struct.Struct(">ii")


@dataclass(frozen=True, slots=True, order=True)
class TopicPartitions:
    """A topic as the assignment sees it: its id (scores derive from it) and partition count."""

    name: str
    topic_id: str
    partitions: int


Partition = tuple[str, int]  # (topic name, partition)


def score(topic_id: str, partition: int, broker: int) -> int:
    """Rendezvous score of a broker for a partition (partition -1: for the topic as a whole)."""
    return _score(uuid.UUID(topic_id).bytes, partition, broker)


def _score(topic_id: bytes, partition: int, broker: int) -> int:
    return int(crc32c.crc32c(topic_id + _SCORE.pack(partition, broker)))


def target(
    brokers: Iterable[int],
    topics: Iterable[TopicPartitions],
    owners: Mapping[Partition, int],
) -> dict[Partition, int]:
    """The owner each partition should have. ``owners`` is who owns what now (a partition owned
    by a broker not in ``brokers`` counts as unowned). Empty when there is no broker."""
    live = sorted(set(brokers))
    if not live:
        return {}
    current = {p: b for p, b in owners.items() if b in set(live)}
    load: Counter[int] = Counter({b: 0 for b in live})
    plans = [_plan_topic(topic, live, current, load) for topic in sorted(topics)]
    _even_out(plans, load)
    result: dict[Partition, int] = {}
    for plan in plans:
        result.update(plan.assign(current))
    return result


class _TopicPlan:
    """One topic's quotas (how many partitions each broker gets) and how it fills them."""

    def __init__(self, topic: TopicPartitions, live: list[int], current: Mapping[Partition, int]):
        self.topic = topic
        self.id_bytes = uuid.UUID(topic.topic_id).bytes
        self.quotas = dict.fromkeys(live, 0)
        self.held: Counter[int] = Counter(
            current[(topic.name, p)] for p in range(topic.partitions) if (topic.name, p) in current
        )

    def assign(self, current: Mapping[Partition, int]) -> dict[Partition, int]:
        topic, quotas = self.topic, dict(self.quotas)
        result: dict[Partition, int] = {}
        # Keep: each broker keeps up to its quota of what it owns, its best-scored first.
        kept: dict[int, list[int]] = defaultdict(list)
        for p in range(topic.partitions):
            owner = current.get((topic.name, p))
            if owner is not None and owner in quotas:
                kept[owner].append(p)
        for broker, partitions in kept.items():
            partitions.sort(key=lambda p: -_score(self.id_bytes, p, broker))
            for p in partitions[: quotas[broker]]:
                result[(topic.name, p)] = broker
            quotas[broker] -= min(quotas[broker], len(partitions))
        # Place the rest, each with the highest-scored broker that still has room.
        for p in range(topic.partitions):
            if (topic.name, p) in result:
                continue
            room = [b for b, left in quotas.items() if left > 0]
            broker = max(room, key=lambda b: (_score(self.id_bytes, p, b), -b))
            result[(topic.name, p)] = broker
            quotas[broker] -= 1
        return result


def _plan_topic(
    topic: TopicPartitions,
    live: list[int],
    current: Mapping[Partition, int],
    load: Counter[int],
) -> _TopicPlan:
    """Quotas for one topic: ``n // B`` each, and the ``n % B`` extras to the brokers that hold
    more than that already (sticky), then to those with the fewest partitions so far."""
    base, extras = divmod(topic.partitions, len(live))
    plan = _TopicPlan(topic, live, current)
    ranked = sorted(
        live,
        key=lambda b: (-(plan.held[b] > base), load[b], -_score(plan.id_bytes, -1, b), b),
    )
    for broker in live:
        plan.quotas[broker] = base
    for broker in ranked[:extras]:
        plan.quotas[broker] += 1
    for broker, quota in plan.quotas.items():
        load[broker] += quota
    return plan


def _even_out(plans: list[_TopicPlan], load: Counter[int]) -> None:
    """Move topics' extra partitions from the most to the least loaded brokers until totals
    differ by at most one. A move keeps its topic balanced: it takes an extra from a broker at
    ``base + 1`` of that topic and gives it to one at ``base``. If totals differ by two or more,
    such a topic exists (each topic adds -1, 0 or 1 to the difference). Of the possible moves,
    those that move fewest partitions go first: a quota unit taken from a broker that does not
    hold that many, or given to one that holds more than its quota, costs no movement."""
    total, brokers = sum(load.values()), len(load)
    floor, ceiling = total // brokers, -(-total // brokers)
    while True:
        high, low = max(load.values()), min(load.values())
        if high - low <= 1:
            return
        best: tuple[int, int, int, list[_TopicPlan]] | None = None
        for most in sorted(b for b in load if load[b] == high):
            for least in sorted(b for b in load if load[b] == low):
                movable = sorted(
                    (plan for plan in plans if plan.quotas[most] > plan.quotas[least]),
                    key=lambda plan: (-_gain(plan, most, least), plan.topic),
                )
                if movable and (best is None or _gain(movable[0], most, least) > best[0]):
                    best = (_gain(movable[0], most, least), most, least, movable)
        if best is None:  # pragma: no cover - impossible, see above; never loop forever
            return
        _, most, least, movable = best
        # As many as takes one of the two to the average, so no partition moves twice.
        count = max(1, min(load[most] - ceiling, floor - load[least]))
        for plan in movable[:count]:
            plan.quotas[most] -= 1
            plan.quotas[least] += 1
            load[most] -= 1
            load[least] += 1


def _gain(plan: _TopicPlan, giver: int, taker: int) -> int:
    """How many more partitions stay where they are if ``giver`` hands ``taker`` one unit of
    ``plan``'s quota: -1, 0 or 1."""
    return int(plan.held[taker] > plan.quotas[taker]) - int(plan.held[giver] >= plan.quotas[giver])
