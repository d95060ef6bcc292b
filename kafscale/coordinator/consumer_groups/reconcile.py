"""One member's next step toward its target assignment (Kafka's ``CurrentAssignmentBuilder``).
Pure: the member, the target, who holds what, and what the member reports owning, in; the
member as it is after this heartbeat, out.

- kept = assigned & target; to revoke = assigned - target; to add = target - assigned, of which
  only the partitions nobody else holds (``held_by_other``) are given now.
- Something to revoke that the member still reports owning: it stays at its epoch, keeps only the
  kept partitions and is UNREVOKED_PARTITIONS until it reports them gone (the coordinator fences
  it if that takes longer than its rebalance timeout).
- Otherwise it moves to the target epoch with the kept and the free partitions: STABLE, or
  UNRELEASED_PARTITIONS while some of its target is still held by others (it gets them at a
  later heartbeat, once released).

``owned`` is what the member reported (None: unchanged since its last heartbeat, so assumed
still owned). Partitions of topics the member no longer subscribes to are revoked even when a
target computed before its subscription changed still names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kafscale.coordinator.consumer_groups.model import (
    ConsumerMember,
    MemberState,
    Partitions,
)


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    subscribed: Callable[[str], bool],
    held_by_other: Callable[[str, int], bool],
    owned: Partitions | None,
) -> ConsumerMember:
    """``subscribed(topic_id)``: whether the member subscribes to the topic now."""
    target = {t: p for t, p in member.target.items() if subscribed(t)}
    if member.state is MemberState.STABLE:
        unsubscribed = any(not subscribed(t) for t in member.assigned)
        if member.member_epoch == target_epoch and not unsubscribed:
            return member
    elif member.state is MemberState.UNREVOKED_PARTITIONS and _owns_any(
        owned, member.pending_revocation
    ):
        return member
    return _next(member, target_epoch, target, held_by_other, owned)


def _next(
    member: ConsumerMember,
    target_epoch: int,
    target: Partitions,
    held_by_other: Callable[[str, int], bool],
    owned: Partitions | None,
) -> ConsumerMember:
    kept: Partitions = {}
    revoke: Partitions = {}
    add: Partitions = {}
    unreleased = False
    for topic in sorted(set(target) | set(member.assigned)):
        wanted = target.get(topic, frozenset())
        have = member.assigned.get(topic, frozenset())
        free = set()
        for p in wanted - have:
            if held_by_other(topic, p):
                unreleased = True
            else:
                free.add(p)
        _put(kept, topic, have & wanted)
        _put(revoke, topic, have - wanted)
        _put(add, topic, frozenset(free))
    if revoke and _owns_any(owned, revoke):
        return _evolve(
            member,
            MemberState.UNREVOKED_PARTITIONS,
            member.member_epoch,
            kept,
            revoke,
        )
    assigned = {t: kept.get(t, frozenset()) | add.get(t, frozenset()) for t in kept | add}
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return _evolve(member, state, target_epoch, assigned, {})


def _evolve(
    member: ConsumerMember,
    state: MemberState,
    epoch: int,
    assigned: Partitions,
    pending_revocation: Partitions,
) -> ConsumerMember:
    return dataclasses.replace(
        member,
        state=state,
        member_epoch=epoch,
        previous_member_epoch=member.member_epoch,
        assigned=assigned,
        pending_revocation=pending_revocation,
    )


def _put(into: Partitions, topic: str, partitions: frozenset[int]) -> None:
    if partitions:
        into[topic] = partitions


def _owns_any(owned: Partitions | None, partitions: Partitions) -> bool:
    if owned is None:
        return True
    return any(owned.get(topic, frozenset()) & p for topic, p in partitions.items())
