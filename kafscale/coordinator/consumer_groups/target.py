"""A consumer group's target assignment (Kafka's ``TargetAssignmentBuilder``) and what it is
computed from: the members' subscriptions resolved against the cluster's topics (by name, or by
regular expression matched against the whole name), the assignor most members name, and a digest
of the subscribed topics whose change bumps the group epoch. Pure."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Mapping

from kafscale.coordinator.consumer_groups import assignors
from kafscale.coordinator.consumer_groups.model import (
    ConsumerGroup,
    ConsumerMember,
    ConsumerSettings,
)

# topic name -> (topic id, partition count): the cluster's topics as the coordinator sees them
Topics = Mapping[str, tuple[str, int]]


def assign_if_due(
    g: ConsumerGroup, settings: ConsumerSettings, topics: Topics, now: int
) -> set[str] | None:
    """A new target for ``g`` (changed in place) if its epoch moved past its assignment epoch
    and ``assignment_interval_ms`` has passed: the ids of the members whose target changed, or
    None when no target was computed."""
    if g.epoch <= g.assignment_epoch:
        return None
    if now < g.target_ms + settings.assignment_interval_ms:
        return None
    changed: set[str] = set()
    name = preferred_assignor(g, settings)
    subscribed = {m.member_id: subscribed_ids(m, topics) for m in g.members.values()}
    counts = {topic_id: count for topic_id, count in topics.values()}
    wanted = {t for ids in subscribed.values() for t in ids if t in counts}
    specs = {
        m.member_id: assignors.MemberSpec(frozenset(subscribed[m.member_id]), m.target)
        for m in g.members.values()
    }
    target = assignors.assign(name, specs, {t: counts[t] for t in wanted})
    for member_id, member in list(g.members.items()):
        new_target = target.get(member_id, {})
        if new_target != member.target or member.target_epoch != g.epoch:
            g.members[member_id] = dataclasses.replace(
                member, target=new_target, target_epoch=g.epoch
            )
            changed.add(member_id)
    g.assignment_epoch = g.epoch
    g.target_ms = now
    return changed


def preferred_assignor(g: ConsumerGroup, settings: ConsumerSettings) -> str:
    """The assignor most members name (ties: the first of the settings'), else the default."""
    votes = Counter(
        m.server_assignor for m in g.members.values() if m.server_assignor in settings.assignors
    )
    if not votes:
        return settings.assignors[0]
    most = max(votes.values())
    return next(name for name in settings.assignors if votes.get(name) == most)


def subscribed_ids(member: ConsumerMember, topics: Topics) -> set[str]:
    """The ids of the topics the member subscribes to, by name or by its regex (matched against
    the whole name, as RE2/J's ``matches``)."""
    ids = {topics[name][0] for name in member.subscribed_topic_names if name in topics}
    if member.subscribed_topic_regex:
        pattern = re.compile(member.subscribed_topic_regex)
        ids.update(topic_id for name, (topic_id, _) in topics.items() if pattern.fullmatch(name))
    return ids


def subscription_hash(g: ConsumerGroup, topics: Topics) -> str:
    """A digest of every subscribed topic's id, name and partition count."""
    digest = hashlib.sha256()
    subscribed: set[str] = set()
    for member in g.members.values():
        subscribed |= subscribed_ids(member, topics)
    by_id = {topic_id: (name, count) for name, (topic_id, count) in topics.items()}
    for topic_id in sorted(subscribed):
        name, count = by_id[topic_id]
        digest.update(f"{topic_id}\0{name}\0{count}\n".encode())
    return digest.hexdigest()[:32] if subscribed else ""
