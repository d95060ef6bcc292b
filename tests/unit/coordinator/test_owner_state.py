"""The ownership state machine: claims, losses, hand-over, drain and fencing, without I/O.

The last tests run several brokers' state machines against one in-memory table of leader keys
(a compare-and-set stand-in for etcd), delivering views late and in different orders, and check
that ownership converges to a balanced assignment and that the store never has two owners.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter

from kafscale.coordinator.assignment import Partition, TopicPartitions
from kafscale.coordinator.owner_state import (
    Claim,
    ClaimDone,
    Close,
    DeleteLeader,
    DrainStarted,
    Fenced,
    Instruction,
    Open,
    OwnerState,
    ReleaseDone,
    Seal,
    Sealed,
    Tick,
    ViewChanged,
)
from kafscale.metadata.records import LeaderRecord

TOPIC = TopicPartitions("orders", "6f1c1d5e-8f33-4c51-9d0e-6a3d7a1e0f11", 6)
ALL = tuple(("orders", p) for p in range(6))


def state(me: int = 1, **kwargs) -> OwnerState:
    return OwnerState(me=me, lease=100 + me, run_id=f"run-{me}", handover_timeout_ms=5000, **kwargs)


def leader(owner: int, epoch: int = 0) -> LeaderRecord:
    return LeaderRecord(owner=owner, epoch=epoch, lease=100 + owner, run_id=f"run-{owner}")


def view(revision: int, brokers: dict[int, bool], leaders=None, topics=(TOPIC,)) -> ViewChanged:
    return ViewChanged(revision, brokers, tuple(topics), dict(leaders or {}))


def kinds(instructions: list[Instruction]) -> list[str]:
    return [type(i).__name__ for i in instructions]


def test_a_lone_broker_claims_every_partition_then_opens_each():
    s = state()
    out = s.handle(view(5, {1: False}))
    assert out == [Claim(ALL)]
    assert s.handle(view(6, {1: False})) == []  # already claiming: no second claim
    opened = s.handle(ClaimDone(ALL[0], leader(1, 3), revision=7))
    assert opened == [Open(ALL[0], leader(1, 3))]
    assert s.owned == {ALL[0]: leader(1, 3)}


def test_claims_are_bounded():
    s = state(max_claims=4)
    (claim,) = s.handle(view(1, {1: False}))
    assert isinstance(claim, Claim) and len(claim.partitions) == 4
    s.handle(ClaimDone(claim.partitions[0], None))  # lost the race: room for one more
    (again,) = s.handle(view(2, {1: False}))
    assert isinstance(again, Claim) and len(again.partitions) == 1


def test_a_partition_owned_by_someone_else_is_never_claimed():
    s = state()
    (claim,) = s.handle(view(1, {1: False}, {ALL[0]: leader(2)}))
    assert isinstance(claim, Claim) and ALL[0] not in claim.partitions


def test_a_view_older_than_our_claim_does_not_lose_the_partition():
    s = state()
    s.handle(view(1, {1: False}))
    s.handle(ClaimDone(ALL[0], leader(1), revision=10))
    assert not [i for i in s.handle(view(9, {1: False})) if isinstance(i, Close)]
    assert ALL[0] in s.owned


def test_a_newer_view_without_our_key_closes_the_partition():
    s = state()
    s.handle(view(1, {1: False}))
    s.handle(ClaimDone(ALL[0], leader(1), revision=10))
    out = s.handle(view(11, {1: False}))
    closes = [i for i in out if isinstance(i, Close)]
    assert [c.partition for c in closes] == [ALL[0]] and "lease" in closes[0].reason
    assert ALL[0] not in s.owned


def test_a_partition_claimed_by_another_broker_is_closed_not_sealed():
    s = state()
    s.handle(view(1, {1: False}))
    s.handle(ClaimDone(ALL[0], leader(1, 0), revision=2))
    out = s.handle(view(3, {1: False, 2: False}, {ALL[0]: leader(2, 1)}))
    closes = [i for i in out if isinstance(i, Close)]
    assert closes[0].partition == ALL[0] and "broker 2" in closes[0].reason
    assert not [i for i in out if isinstance(i, Seal) and i.partition == ALL[0]]


def test_a_respawned_coordinator_takes_back_its_own_keys():
    s = state()
    mine = {p: leader(1, 4) for p in ALL}
    out = s.handle(view(1, {1: False}, mine))
    assert sorted(kinds(out)) == ["Open"] * 6
    assert s.owned == mine


def test_keys_of_an_earlier_lease_are_not_taken_back():
    s = state()
    old = LeaderRecord(owner=1, epoch=4, lease=99, run_id="run-old")
    out = s.handle(view(1, {1: False}, {p: old for p in ALL}))
    assert out == [] and s.owned == {}


def own_all(s: OwnerState, revision: int = 2) -> None:
    s.handle(view(1, {s.me: False}))
    for p in ALL:
        s.handle(ClaimDone(p, leader(s.me), revision=revision))


def test_a_joining_broker_gets_its_share_by_graceful_hand_over():
    s = state()
    own_all(s)
    joined = view(3, {1: False, 2: False}, {p: leader(1) for p in ALL})
    seals = [i for i in s.handle(joined) if isinstance(i, Seal)]
    assert len(seals) == 3
    moving = seals[0].partition
    assert s.handle(Sealed(moving, epoch=0)) == [DeleteLeader(moving, leader(1))]
    assert s.handle(ReleaseDone(moving, 0, succeeded=True)) == []
    assert moving not in s.deleting and moving not in s.owned


def test_a_booting_broker_gets_its_share_only_once_it_is_ready():
    # Broker 2 registered again after a crash: until every process of it serves, the partitions
    # we took over stay with us (handing them over would keep them offline for its whole boot).
    s = state()
    own_all(s)
    mine = {p: leader(1) for p in ALL}
    booting = ViewChanged(3, {1: False, 2: False}, (TOPIC,), mine, booting=frozenset({2}))
    assert not [i for i in s.handle(booting) if isinstance(i, Seal)]
    ready = ViewChanged(4, {1: False, 2: False}, (TOPIC,), mine)
    assert len([i for i in s.handle(ready) if isinstance(i, Seal)]) == 3


def test_a_booting_broker_claims_what_nobody_owns():
    # A cluster that starts (or a lone broker's restart): its boot recovery needs its partitions.
    s = state()
    out = s.handle(ViewChanged(1, {1: False}, (TOPIC,), {}, booting=frozenset({1})))
    assert out == [Claim(ALL)]


def test_what_a_dead_broker_owned_goes_to_the_ready_ones_while_its_restart_boots():
    # Broker 2 died and registered again (booting) before we claimed its partitions: we claim
    # them all, or they would wait for its whole boot.
    s = state()
    out = s.handle(ViewChanged(5, {1: False, 2: False}, (TOPIC,), {}, booting=frozenset({2})))
    assert out == [Claim(ALL)]


def test_a_booting_broker_keeps_what_it_owns():
    # Brokers 1 and 2 started together and each claimed its share while booting; 1 is ready
    # first: 2's partitions stay with it (no churn at a cluster's start).
    s = state()
    theirs = {p: leader(2) for p in ALL[:3]}
    out = s.handle(ViewChanged(5, {1: False, 2: False}, (TOPIC,), theirs, booting=frozenset({2})))
    assert out == [Claim(ALL[3:])]


def test_draining_hands_over_to_a_booting_broker_too():
    s = state()
    own_all(s)
    mine = {p: leader(1) for p in ALL}
    booting = ViewChanged(3, {1: False, 2: False}, (TOPIC,), mine, booting=frozenset({2}))
    assert not [i for i in s.handle(booting) if isinstance(i, Seal)]
    assert len([i for i in s.handle(DrainStarted(0)) if isinstance(i, Seal)]) == 6


def test_a_failed_release_is_retried_on_a_tick():
    s = state()
    own_all(s)
    (seal, *_) = [
        i
        for i in s.handle(view(3, {1: False, 2: False}, {p: leader(1) for p in ALL}))
        if isinstance(i, Seal)
    ]
    s.handle(Sealed(seal.partition, 0))
    s.handle(ReleaseDone(seal.partition, 0, succeeded=False))
    assert DeleteLeader(seal.partition, leader(1)) in s.handle(Tick(now_ms=1))


def test_a_seal_that_takes_too_long_is_abandoned():
    s = state()
    own_all(s)
    s.handle(Tick(now_ms=1000))
    out = s.handle(view(3, {1: False, 2: False}, {p: leader(1) for p in ALL}))
    sealing = [i.partition for i in out if isinstance(i, Seal)]
    assert s.handle(Tick(now_ms=5999)) == []
    out = s.handle(Tick(now_ms=6000))
    assert sorted(i.partition for i in out if isinstance(i, Close)) == sorted(sealing)
    assert sorted(i.partition for i in out if isinstance(i, DeleteLeader)) == sorted(sealing)


def test_drain_hands_everything_over_and_claims_nothing():
    s = state()
    own_all(s)
    out = s.handle(DrainStarted(now_ms=0))
    assert sorted(kinds(out)) == ["Seal"] * 6
    assert not s.drained
    for p in ALL:
        s.handle(Sealed(p, 0))
        s.handle(ReleaseDone(p, 0, succeeded=True))
    assert s.drained
    assert s.handle(view(9, {1: True})) == []  # nothing to claim while draining


def test_a_fenced_commit_closes_the_partition():
    s = state()
    own_all(s)
    out = s.handle(Fenced(ALL[2], epoch=0))
    assert [type(i) for i in out] == [Close] and ALL[2] not in s.owned
    assert s.handle(Fenced(ALL[2], epoch=0)) == []  # once
    assert s.handle(Fenced(ALL[3], epoch=7)) == []  # another epoch: not this ownership


def test_a_deleted_topic_closes_its_partitions():
    s = state()
    own_all(s)
    out = s.handle(view(5, {1: False}, {}, topics=()))
    assert sorted(i.partition for i in out if isinstance(i, Close)) == list(ALL)


# ---- several brokers against one table of leader keys ---------------------------------------


class Cluster:
    """Brokers' state machines over a compare-and-set table; views are delivered when a broker
    is picked (so each sees the table as of some moment), instructions run at once or later."""

    def __init__(self, topics: list[TopicPartitions], seed: int) -> None:
        self.topics = topics
        self.rng = random.Random(seed)
        self.revision = 1
        self.leaders: dict[Partition, LeaderRecord] = {}
        self.epochs: Counter[Partition] = Counter()
        self.brokers: dict[int, bool] = {}
        self.states: dict[int, OwnerState] = {}
        self.pending: list[tuple[int, Instruction]] = []
        self.moves = 0

    def start(self, broker: int) -> None:
        self.brokers[broker] = False
        self.states[broker] = state(broker, max_claims=8, max_seals=8)
        self.revision += 1

    def kill(self, broker: int) -> None:
        del self.brokers[broker], self.states[broker]
        self.leaders = {p: k for p, k in self.leaders.items() if k.owner != broker}
        self.pending = [(b, i) for b, i in self.pending if b != broker]
        self.revision += 1

    def drain(self, broker: int) -> None:
        self.brokers[broker] = True
        self.revision += 1
        self.feed(broker, DrainStarted(now_ms=0))

    def feed(self, broker: int, event) -> None:
        for instruction in self.states[broker].handle(event):
            self.pending.append((broker, instruction))

    def run(self, instruction_broker: int, instruction: Instruction) -> None:
        me = instruction_broker
        match instruction:
            case Claim(partitions):
                for p in partitions:
                    if p in self.leaders:
                        self.feed(me, ClaimDone(p, None))
                        continue
                    epoch = self.epochs[p]
                    self.epochs[p] += 1
                    self.revision += 1
                    self.leaders[p] = leader(me, epoch)
                    self.moves += 1
                    self.feed(me, ClaimDone(p, self.leaders[p], self.revision))
            case Seal(p, held):
                self.feed(me, Sealed(p, held.epoch))
            case DeleteLeader(p, held):
                if self.leaders.get(p) == held:
                    del self.leaders[p]
                    self.revision += 1
                self.feed(me, ReleaseDone(p, held.epoch, succeeded=True))
            case Open() | Close():
                pass

    def step(self) -> None:
        if self.pending and self.rng.random() < 0.7:
            index = self.rng.randrange(len(self.pending))
            self.run(*self.pending.pop(index))
        else:
            broker = self.rng.choice(sorted(self.states))
            snapshot = view(self.revision, dict(self.brokers), dict(self.leaders), self.topics)
            self.feed(broker, snapshot)
        self.check()

    def check(self) -> None:
        # The table has one owner per key by construction; what must never happen is two
        # brokers both holding the *current* key value as owned (only one can commit).
        for p, current in self.leaders.items():
            holders = [b for b, s in self.states.items() if s.owned.get(p) == current]
            assert holders in ([], [current.owner]), (p, current, holders)

    def settle(self, steps: int = 5000) -> None:
        for _ in range(steps):
            self.step()
            if not self.pending and self.converged():
                return
        raise AssertionError(f"not converged: {self.summary()}")

    def converged(self) -> bool:
        everyone = [(t.name, p) for t in self.topics for p in range(t.partitions)]
        running = [b for b, d in self.brokers.items() if not d]
        if not all(p in self.leaders for p in everyone):
            return False
        counts = Counter(self.leaders[p].owner for p in everyone)
        if any(self.brokers.get(b) for b in counts):  # a draining broker still owns
            return False
        loads = [counts.get(b, 0) for b in running]
        views_current = all(
            s.view is not None and s.view.revision == self.revision for s in self.states.values()
        )
        return max(loads) - min(loads) <= 1 and views_current

    def summary(self) -> str:
        return f"leaders by owner {Counter(k.owner for k in self.leaders.values())}"


def topics(sizes: list[int], seed: int) -> list[TopicPartitions]:
    rng = random.Random(seed)
    return [
        TopicPartitions(f"t{i}", str(uuid.UUID(int=rng.getrandbits(128))), n)
        for i, n in enumerate(sizes)
    ]


def test_brokers_joining_one_by_one_converge_to_a_balanced_cluster():
    for seed in range(20):
        cluster = Cluster(topics([6, 3, 1, 12], seed), seed)
        cluster.start(0)
        cluster.settle()
        for broker in (1, 2):
            cluster.start(broker)
            cluster.settle()
        # Moves: 22 first claims, then about a third and a sixth of 22 moving: far below 3 x 22.
        assert cluster.moves <= 22 + 8 + 8 + 6, cluster.moves


def test_a_killed_broker_partitions_are_taken_over():
    for seed in range(20):
        cluster = Cluster(topics([6, 6], seed), seed)
        for broker in (0, 1, 2):
            cluster.start(broker)
        cluster.settle()
        cluster.kill(1)
        cluster.settle()
        assert {k.owner for k in cluster.leaders.values()} == {0, 2}


def test_a_draining_broker_hands_everything_over():
    for seed in range(20):
        cluster = Cluster(topics([6, 6], seed), seed)
        for broker in (0, 1, 2):
            cluster.start(broker)
        cluster.settle()
        cluster.drain(2)
        cluster.settle()
        assert cluster.states[2].drained
        assert {k.owner for k in cluster.leaders.values()} == {0, 1}


def test_a_paused_broker_that_lost_its_lease_closes_everything_when_it_wakes():
    for seed in range(20):
        cluster = Cluster(topics([6, 6], seed), seed)
        for broker in (0, 1, 2):
            cluster.start(broker)
        cluster.settle()
        paused = cluster.states.pop(2)  # SIGSTOP: no views, no instructions run
        held = dict(paused.owned)
        assert held
        del cluster.brokers[2]  # its lease expires: registration and leader keys go
        cluster.leaders = {p: k for p, k in cluster.leaders.items() if k.owner != 2}
        cluster.pending = [(b, i) for b, i in cluster.pending if b != 2]
        cluster.revision += 1
        cluster.settle()
        woken = paused.handle(view(cluster.revision, dict(cluster.brokers), dict(cluster.leaders)))
        closed = {i.partition for i in woken if isinstance(i, Close)}
        assert closed == set(held) and not paused.owned
        assert not [i for i in woken if isinstance(i, Seal | Open)]


def test_a_released_key_a_lagging_view_still_shows_is_not_taken_back():
    s = state()
    own_all(s)
    s.handle(DrainStarted(now_ms=0))
    for p in ALL:
        s.handle(Sealed(p, 0))
        s.handle(ReleaseDone(p, 0, succeeded=True))
    stale = view(9, {1: True}, {p: leader(1) for p in ALL})  # the deletes not seen yet
    assert s.handle(stale) == [] and s.drained
    s.handle(view(10, {1: True}))  # now they are
    assert s.released == {}
