"""kcat has no admin API: it creates a topic by producing to it (the broker's auto-creation, on by
default, as in Kafka) and describes topics with `-L` (issue 7, the compatibility matrix)."""

from __future__ import annotations

import json
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
