"""Several brokers on one bucket and etcd namespace: one fenced owner per partition.

Three real `kafscale serve` process families on this machine, on the suite's real etcd and MinIO,
driven by librdkafka (confluent-kafka): leaders spread and every broker says the same; a leader
SIGKILLed under acks=all idempotent load (librdkafka's, and kafka-clients' from the Java probe's
produce-load) loses nothing acknowledged and duplicates nothing; a SIGSTOPped owner woken after
its lease can land nothing and rejoins; a SIGTERMed broker hands its partitions over. Every test
ends with the shared history check (tests/harness/history.py).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kafscale.metadata import records
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.records import Keys
from tests.harness.history import History, value
from tests.harness.java_load import JavaLoads

pytestmark = pytest.mark.integration

TOPIC = "scale-out"
PARTITIONS = 6
# A short broker lease: failover waits for the dead owner's lease to run out.
FAST = {"KAFSCALE_STORE_LOCK_TTL_MS": "6000", "KAFSCALE_SHARDS": "1"}


def start_cluster(
    start_broker: Callable[..., Any], size: int, env: dict[str, str] | None = None
) -> list[Any]:
    brokers = [
        start_broker(backends="real", env={**FAST, **(env or {}), "KAFSCALE_BROKER_ID": str(i)})
        for i in range(size)
    ]
    for broker in brokers:
        broker.wait_ready()
    return brokers


def bootstrap(brokers: list[Any]) -> str:
    return ",".join(broker.bootstrap for broker in brokers)


def create_topic(brokers: list[Any], partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(timeout=60)


def leaders_seen_by(broker: Any) -> dict[int, tuple[int, int]]:
    """partition -> (leader node id, leader epoch) as this one broker's Metadata answers; the
    epoch from the leader key in etcd (confluent-kafka's metadata does not show it)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    metadata = admin.list_topics(TOPIC, timeout=20)
    store = EtcdMetadataStore(list(broker.env["KAFSCALE_ETCD_ENDPOINTS"].split(",")))
    try:
        keys = Keys(broker.env["KAFSCALE_S3_NAMESPACE"])
        epochs = {}
        for kv in store.get_prefix(keys.topic_leaders(TOPIC)):
            parsed = keys.parse_leader(kv.key)
            if parsed is not None:
                epochs[parsed[1]] = records.decode_leader(kv.value).epoch
    finally:
        store.close()
    return {
        p.id: (p.leader, epochs.get(p.id, -1)) for p in metadata.topics[TOPIC].partitions.values()
    }


def wait_for_leaders(
    brokers: list[Any], live: set[int], timeout: float = 60
) -> dict[int, tuple[int, int]]:
    """Every partition led by a broker of ``live``, and every broker of ``brokers`` agreeing."""
    deadline = time.monotonic() + timeout
    seen: list[dict[int, tuple[int, int]]] = []
    while time.monotonic() < deadline:
        seen = [leaders_seen_by(broker) for broker in brokers]
        first = seen[0]
        if (
            len(first) == PARTITIONS
            and all(leader in live for leader, _ in first.values())
            and all(other == first for other in seen[1:])
        ):
            return first
        time.sleep(0.5)
    raise AssertionError(f"leaders did not settle on {live}: {seen}")


def wait_for_spread(brokers: list[Any], timeout: float = 90) -> dict[int, tuple[int, int]]:
    """Every broker leads as many partitions as every other, and all agree."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = wait_for_leaders(brokers, set(range(len(brokers))), timeout)
        counts = Counter(leader for leader, _ in leaders.values())
        if len(counts) == len(brokers) and max(counts.values()) - min(counts.values()) <= 1:
            return leaders
        assert time.monotonic() < deadline, f"leaders not spread: {leaders}"
        time.sleep(0.5)


class LoadProducer:
    """An idempotent acks=all producer sending to every partition from a thread until stopped,
    recording each acknowledgement in ``history``."""

    def __init__(self, brokers: list[Any], history: History, name: str) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap(brokers),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        self.history, self.name = history, name
        self.acked_at: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
        self.sent = 0
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_acked(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.history.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.history.acked)} acked"
            time.sleep(0.1)

    def more(self, count: int) -> None:
        """Wait until ``count`` more records than now are acknowledged."""
        self.wait_acked(len(self.history.acked) + count, timeout=120)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        assert self.producer.flush(120) == 0, "records still in flight after 120 s"

    def _run(self) -> None:
        while not self._stop.is_set():
            data = value(self.name, self.sent)
            try:
                self.producer.produce(
                    TOPIC, data, partition=self.sent % PARTITIONS, on_delivery=self._delivered
                )
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.004)  # ~250 records/s: enough to span every fault, quick to read

    def _delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            self.errors[err.name()] += 1
        else:
            self.history.ack(TOPIC, message.partition(), message.offset(), message.value())
            self.acked_at[message.partition()].append(time.monotonic())

    def outage(self, moment: float, partitions: list[int]) -> float:
        """The longest time ``partitions`` went without an acknowledgement after ``moment``:
        how long clients waited for them to move (callbacks of acks received before the
        fault still come in after it, so the first ack after it says nothing)."""
        longest = 0.0
        for p in partitions:
            times = [t for t in self.acked_at[p] if t > moment - 1.0]
            gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
            longest = max(longest, *gaps, 0.0)
        return longest


def read_everything(brokers: list[Any], history: History, expected: int) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "group.id": "scale-out-reader",
            "enable.auto.commit": False,
        }
    )
    read = 0
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline, quiet_since = time.monotonic() + 120, time.monotonic()
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                if read >= expected and time.monotonic() - quiet_since > 3:
                    return
                continue
            history.saw(TOPIC, message.partition(), message.offset(), message.value())
            read += 1
            quiet_since = time.monotonic()
    finally:
        consumer.close()


def loaded_cluster(
    start_broker: Callable[..., Any], size: int, env: dict[str, str] | None = None
) -> tuple[list[Any], dict[int, tuple[int, int]], LoadProducer]:
    """``size`` brokers, the topic led by all of them, and a load that got 1,000 acks."""
    brokers = start_cluster(start_broker, size, env)
    create_topic(brokers)
    leaders = wait_for_leaders(brokers, set(range(size)))
    load = LoadProducer(brokers, History(), "p1")
    load.start()
    load.wait_acked(1000)
    return brokers, leaders, load


def finish(load: LoadProducer, readers: list[Any], note: str = "") -> None:
    """Stop the load, read everything back through ``readers`` and check the history."""
    load.stop()
    read_everything(readers, load.history, len(load.history.acked))
    print(load.history.check(), dict(load.errors), note)


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
