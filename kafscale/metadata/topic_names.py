"""Kafka's rules for topic names (``org.apache.kafka.common.internals.Topic.validate``).

Shared by the coordinator, which refuses to create a topic with an illegal name, and the
frontend, which answers requests naming one (DescribeConfigs) without asking the coordinator.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 249  # Kafka's Topic.MAX_NAME_LENGTH
OFFSETS_TOPIC = "__consumer_offsets"  # Kafka's Topic.GROUP_METADATA_TOPIC_NAME
# Kafka's Topic.INTERNAL_TOPICS: Metadata reports these is_internal by name, clients leave them
# out of regex subscriptions, and Produce refuses them.
INTERNAL_TOPICS = frozenset((OFFSETS_TOPIC, "__transaction_state", "__share_group_state"))
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def name_error(name: str) -> str | None:
    """Why ``name`` is not a legal topic name, or None."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        return f"topic name is longer than {MAX_NAME_LENGTH} characters"
    if not _LEGAL_NAME.fullmatch(name):
        return f"topic name {name!r} may only contain ASCII alphanumerics, '.', '_' and '-'"
    return None
