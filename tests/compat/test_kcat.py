"""kcat has no admin API: it creates a topic by producing to it (the broker's auto-creation, on by
default, as in Kafka) and describes topics with `-L` (issue 7, the compatibility matrix). Its
balanced consumer (`-G`) is a group member of tests/integration/test_group_clients.py; with
the KIP-848 protocol it cannot be one yet (tests/compat/matrix.py's NOT_APPLICABLE says why)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.harness.broker import BrokerProcess

pytestmark = pytest.mark.integration


@pytest.mark.compat("create", "kcat")
def test_kcat_creates_a_topic_by_producing_to_it(kafscale: BrokerProcess, kcat: str) -> None:
    topic = "made-by-kcat"
    bootstrap = ["-b", kafscale.bootstrap]
    produced = subprocess.run(
        [kcat, *bootstrap, "-P", "-t", topic, "-X", "acks=all"],
        input=b"one\ntwo\nthree\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr.decode()
    listed = subprocess.run(
        [kcat, *bootstrap, "-L", "-J", "-t", topic, "-m", "15"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    [described] = json.loads(listed.stdout)["topics"]
    assert described["topic"] == topic and "error" not in described, described
    # KAFSCALE_AUTO_CREATE_PARTITIONS defaults to 1, like Kafka's num.partitions
    assert [(p["partition"], p["leader"]) for p in described["partitions"]] == [(0, 0)]
    consumed = subprocess.run(
        [kcat, *bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert consumed.stdout.decode().split() == ["one", "two", "three"]


def test_debian_kcat_has_no_consumer_group_protocol_yet(kcat: str) -> None:
    """The reason the matrix gives for kcat's empty KIP-848 cell. When this fails, kcat's
    librdkafka has group.protocol: drop the NOT_APPLICABLE entry and test `kcat -G` with
    `-X group.protocol=consumer` (tests.harness.kcat_group passes --config on as -X)."""
    version = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30, check=True)
    found = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", version.stdout)
    assert found is not None, version.stdout
    assert tuple(map(int, found.groups())) < (2, 4, 0), version.stdout
    refused = subprocess.run(
        [kcat, "-b", "127.0.0.1:1", "-G", "g", "-X", "group.protocol=consumer", "t"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert 'No such configuration property: "group.protocol"' in refused.stderr, refused
