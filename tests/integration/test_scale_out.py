"""Several brokers on one bucket and etcd namespace: one fenced owner per partition.

Three real `kafscale serve` process families on this machine, on the suite's real etcd and MinIO,
driven by librdkafka (confluent-kafka): leaders spread and every broker says the same; a leader
SIGKILLed under acks=all idempotent load (librdkafka's, and kafka-clients' from the Java probe's
produce-load) loses nothing acknowledged and duplicates nothing; a SIGSTOPped owner woken after
its lease can land nothing and rejoins; a SIGTERMed broker hands its partitions over. Every test
ends with the shared history check (tests/harness/history.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.cluster import (
    FAST,
    PARTITIONS,
    TOPIC,
    bootstrap,
    create_topic,
    finish,
    loaded_cluster,
    start_cluster,
    wait_for_leaders,
    wait_for_spread,
)
from tests.harness.java_load import JavaLoads

pytestmark = pytest.mark.integration


def test_leaders_spread_over_three_brokers_and_every_broker_agrees(
    start_broker: Callable[..., Any],
) -> None:
    brokers = start_cluster(start_broker, 3)
    create_topic(brokers)
    leaders = wait_for_leaders(brokers, {0, 1, 2})
    assert sorted(Counter(leader for leader, _ in leaders.values()).values()) == [2, 2, 2]


@pytest.mark.java
def test_a_sigkilled_leader_under_idempotent_load_loses_and_duplicates_nothing(
    start_broker: Callable[..., Any], java_load: JavaLoads
) -> None:
    brokers, before, load = loaded_cluster(start_broker, 3)
    # A second idempotent acks=all load, from kafka-clients (Java), into the same history.
    java = java_load(bootstrap(brokers), TOPIC, PARTITIONS, load.history, "java")
    java.more(500)
    load.more(1000)
    killed_at = time.monotonic()
    brokers[1].kill()  # the whole process family, no goodbye
    survivors = [brokers[0], brokers[2]]
    after = wait_for_leaders(survivors, {0, 2})
    settled = time.monotonic()
    moved = [p for p, (leader, _) in before.items() if leader == 1]
    assert all(after[p][1] > before[p][1] for p in moved)  # new owners at newer epochs
    load.more(2000)
    java.more(1000)
    for producer in (load, java):  # both carried on on the moved partitions
        assert all(max(producer.acked_at[p]) > settled for p in moved), producer.name
    java.stop()
    failover = max(load.outage(killed_at, moved), java.outage(killed_at, moved))
    note = f"java {java.acked} acked {dict(java.errors)}"
    finish(load, survivors, f"failover {failover:.1f} s (lease TTL 6 s), {note}")


def test_a_paused_owner_woken_after_its_lease_lands_nothing(
    start_broker: Callable[..., Any],
) -> None:
    brokers, before, load = loaded_cluster(start_broker, 3)
    paused = brokers[2]
    family = [paused.pid, *paused.children()]
    for pid in family:
        os.kill(pid, signal.SIGSTOP)
    try:
        survivors = [brokers[0], brokers[1]]
        wait_for_leaders(survivors, {0, 1})  # its lease ran out: others own its partitions
        load.more(1000)
    finally:
        for pid in family:
            os.kill(pid, signal.SIGCONT)
    # Woken, it finds its lease gone: its children are killed with what they held (the history
    # check proves none of it landed) and it rejoins in place, then gets its share back.
    deadline = time.monotonic() + 60
    while "rejoining the cluster with a new broker lease" not in paused.log_text():
        assert paused.running and time.monotonic() < deadline, paused.log_tail()
        time.sleep(0.2)
    load.more(500)
    after = wait_for_spread(brokers)
    moved = [p for p, (leader, _) in before.items() if leader == 2]
    assert all(after[p][1] > before[p][1] for p in moved)
    assert paused.running
    finish(load, brokers)


def test_a_sigtermed_broker_hands_its_partitions_over(start_broker: Callable[..., Any]) -> None:
    brokers, _, load = loaded_cluster(start_broker, 3)
    assert brokers[0].terminate() == 0
    assert "every partition handed over" in brokers[0].log_text()
    survivors = brokers[1:]
    wait_for_leaders(survivors, {1, 2}, timeout=30)
    load.more(1000)
    finish(load, survivors)


def test_kafscale_drain_hands_everything_over_before_the_stop(
    start_broker: Callable[..., Any],
) -> None:
    # What the StatefulSet's preStop hook runs: the broker keeps running, owning nothing.
    token = "drain-token-" + "x" * 16
    brokers, _, load = loaded_cluster(start_broker, 3, {"KAFSCALE_ADMIN_TOKEN": token})
    drain = subprocess.run(
        [sys.executable, "-m", "kafscale", "drain", "--metrics-url",
         f"http://127.0.0.1:{brokers[0].metrics_port}"],
        env={**os.environ, "KAFSCALE_ADMIN_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert drain.returncode == 0, drain.stderr
    assert '"drained": true' in drain.stdout
    wait_for_leaders(brokers, {1, 2}, timeout=30)  # every broker, the drained one too, agrees
    assert brokers[0].running
    load.more(1000)
    assert brokers[0].terminate() == 0
    finish(load, brokers[1:])


@pytest.mark.long
def test_a_rolling_restart_of_every_broker_under_load_costs_only_retriable_errors(
    start_broker: Callable[..., Any],
) -> None:
    brokers, _, load = loaded_cluster(start_broker, 3)
    for index in range(3):
        assert brokers[index].terminate() == 0  # hand-over first
        brokers[index] = start_broker(env=brokers[index].env)  # same id, ports, namespace
        brokers[index].wait_ready()
        wait_for_leaders(brokers, {0, 1, 2})
        load.more(500)
    finish(load, brokers)


@pytest.mark.long
def test_scaling_one_to_three_and_back_moves_partitions_without_loss(
    start_broker: Callable[..., Any],
) -> None:
    first, _, load = loaded_cluster(start_broker, 1)
    added = [
        start_broker(backends="real", env={**FAST, "KAFSCALE_BROKER_ID": str(i)}, ready=True)
        for i in (1, 2)
    ]
    brokers = first + added
    leaders = wait_for_leaders(brokers, {0, 1, 2})
    assert sorted(Counter(leader for leader, _ in leaders.values()).values()) == [2, 2, 2]
    load.more(1000)
    for broker in added:
        assert broker.terminate() == 0
    wait_for_leaders(first, {0})
    load.more(1000)
    finish(load, first)
