"""The compatibility matrix: which test proves which (client, scenario) cell (issue 7).

A test says what it proves with a marker, read at collection time (tests/conftest.py):

    @pytest.mark.compat("group", param="client")         # the client is the test's parameter
    @pytest.mark.compat("create", "aiokafka", "kafka-python")   # or named

`param` names the parametrize argument that holds the client; `prefix` turns its value into the
client's name ("3.9" with prefix "java-" is "java-3.9"). Each (client, scenario) a test proves
becomes a `compat` user property, which pytest-xdist carries to the controller and JUnit XML
records; tests/compat/report.py builds docs/compatibility.md from that XML. A cell passes when
every test that proves it passed; a cell no test proves is empty unless NOT_APPLICABLE says why.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SCENARIOS = {
    "create": "Create a topic",
    "produce": "Produce with every codec",
    "earliest": "Consume from earliest",
    "latest": "Consume from latest",
    "timestamp": "Consume from a timestamp",
    "group": "Consumer group: commit and rebalance",
    "kip848": "Consumer group, KIP-848 protocol (group.protocol=consumer)",
    "admin": "Admin: describe",
    "scram": "SCRAM-SHA-512 over TLS: authenticate, produce, consume in a group",
    "acl": "ACL denied: the authorization error",
}

CLIENTS = {
    "kcat": "kcat (librdkafka)",
    "confluent-kafka": "confluent-kafka (librdkafka)",
    "aiokafka": "aiokafka",
    "kafka-python": "kafka-python",
    "java-3.9": "Java kafka-clients 3.9",
    "java-4": "Java kafka-clients 4",
    "franz-go": "franz-go (kgo)",
    "kafkajs": "kafkajs",
    "spark": "Spark Kafka source",
}

NOT_APPLICABLE = {
    ("spark", "create"): "Spark's Kafka source reads and writes records; it creates no topics",
    ("spark", "produce"): "a batch read only (the issue's scope); Spark writes through the "
    "same kafka-clients producer as Java kafka-clients 3.9",
    ("spark", "latest"): "a batch read cannot start at latest (Spark refuses "
    "startingOffsets=latest); endingOffsets=latest is tested",
    ("spark", "group"): "Spark's Kafka source assigns partitions itself; it commits nothing",
    ("spark", "kip848"): "Spark's Kafka source assigns partitions itself",
    ("java-3.9", "kip848"): "the consumer protocol is in kafka-clients 4.0 and later",
    ("kcat", "kip848"): "Debian 12's kcat 1.7.1 runs on Debian's librdkafka 2.0.2, which has no "
    "group.protocol (librdkafka 2.4.0 added the consumer protocol as early access, 2.12.0 made "
    "it generally available): kcat refuses -X group.protocol=consumer "
    "(tests/compat/test_kcat.py checks this still holds)",
    ("aiokafka", "kip848"): "aiokafka has only the classic group protocol",
    ("kafka-python", "kip848"): "kafka-python has only the classic group protocol",
    ("kafkajs", "kip848"): "kafkajs has only the classic group protocol",
    ("spark", "admin"): "Spark has no admin API",
    ("spark", "acl"): "Spark's Kafka source is not run with SASL (see scram)",
    ("spark", "scram"): "Spark's Kafka source authenticates through kafka-clients 3.9 (its own "
    "row); the reader is not run with SASL",
}

PROPERTY = "compat"


def cells_of(item: pytest.Item) -> list[tuple[str, str]]:
    """The (client, scenario) cells `item`'s compat markers say it proves."""
    cells = []
    for mark in item.iter_markers("compat"):
        scenario, *clients = mark.args
        if scenario not in SCENARIOS:
            raise pytest.UsageError(f"{item.nodeid}: unknown compat scenario {scenario!r}")
        if "param" in mark.kwargs:
            params = getattr(item, "callspec", None)
            if params is None or mark.kwargs["param"] not in params.params:
                raise pytest.UsageError(f"{item.nodeid}: no parameter {mark.kwargs['param']!r}")
            clients.append(mark.kwargs.get("prefix", "") + str(params.params[mark.kwargs["param"]]))
        for client in clients:
            if client not in CLIENTS:
                raise pytest.UsageError(f"{item.nodeid}: unknown compat client {client!r}")
            cells.append((client, scenario))
    return cells


def tag(items: Iterable[pytest.Item]) -> None:
    """Records every item's cells as user properties (collection time, on each xdist worker)."""
    for item in items:
        for client, scenario in cells_of(item):
            item.user_properties.append((PROPERTY, f"{client}|{scenario}"))
