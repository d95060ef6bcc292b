"""Several brokers on one bucket and etcd namespace, under load: what the scale-out tests
(tests/integration/test_scale_out*.py) and the chaos runner (tests/chaos/) share.

- `start_cluster` starts `size` brokers (ids 0..size-1) with a short broker lease;
- `wait_for_leaders` waits until every partition of the topic is led by a live broker and every
  broker's Metadata says the same;
- `LoadProducer` is an idempotent acks=all librdkafka producer sending to every partition from a
  thread, recording each acknowledgement in a `History` (tests/harness/history.py);
- `GroupReader` is a consumer-group member reading along into the same history;
- `read_everything` reads the topic back into the history; `finish` stops the load, reads and
  checks.

Brokers are `tests.harness.broker.BrokerProcess`es; `start_broker` is the `start_broker` fixture
or any `BrokerFactory`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kafscale.metadata import records
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.records import Keys
from tests.harness.history import History, value

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
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    seen: list[dict[int, tuple[int, int]]] | str = []
    while time.monotonic() < deadline:
        try:
            seen = [leaders_seen_by(broker) for broker in brokers]
        except KafkaException as exc:  # a broker restarting its frontends: not settled yet
            seen = str(exc)
            time.sleep(0.5)
            continue
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
    """Every broker leads as many partitions as every other (within one), and all agree."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = wait_for_leaders(brokers, set(range(len(brokers))), timeout)
        counts = Counter(leader for leader, _ in leaders.values())
        if len(counts) == len(brokers) and max(counts.values()) - min(counts.values()) <= 1:
            return leaders
        assert time.monotonic() < deadline, f"leaders not spread: {leaders}"
        time.sleep(0.5)


def longest_gap(acked_at: dict[int, list[float]], moment: float, partitions: list[int]) -> float:
    """The longest time ``partitions`` went without an acknowledgement after ``moment``
    (``acked_at``: partition -> when each ack arrived): how long clients waited for them to move
    (callbacks of acks received before the fault still come in after it, so the first ack after
    it says nothing)."""
    longest = 0.0
    for p in partitions:
        times = [t for t in acked_at[p] if t > moment - 1.0]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        longest = max(longest, *gaps, 0.0)
    return longest


class LoadProducer:
    """An idempotent acks=all producer sending to every partition from a thread until stopped,
    recording each acknowledgement in ``history``.

    Record ``seq`` goes to partition ``seq % PARTITIONS``; `acked_since(seq)` says whether every
    partition has acknowledged a record sent at or after ``seq`` (the load is flowing again).
    ``interval`` is the pause between sends (the default, ~250 records/s, spans every fault and
    is quick to read back). Errors the producer reports are counted in ``errors`` (delivery
    reports) and ``client_errors`` (librdkafka's error callback; a fatal one ends the load).
    """

    def __init__(
        self, brokers: list[Any], history: History, name: str, interval: float = 0.004
    ) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap(brokers),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "error_cb": self._client_error,
            }
        )
        self.history, self.name, self.interval = history, name, interval
        self.acked_at: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
        self.last_acked_seq: dict[int, int] = {p: -1 for p in range(PARTITIONS)}
        self.sent = 0
        self.errors: Counter[str] = Counter()
        self.client_errors: Counter[str] = Counter()
        self.fatal: str | None = None
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

    def acked_since(self, seq: int) -> bool:
        """Whether every partition acknowledged a record sent as ``seq`` or later."""
        return all(last >= seq for last in self.last_acked_seq.values())

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
            self.producer.poll(self.interval)

    def _delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            self.errors[err.name()] += 1
            return
        partition, data = message.partition(), message.value()
        self.history.ack(TOPIC, partition, message.offset(), data)
        self.acked_at[partition].append(time.monotonic())
        seq = int(data.rpartition(b":")[2])
        self.last_acked_seq[partition] = max(self.last_acked_seq[partition], seq)

    def _client_error(self, err: Any) -> None:
        self.client_errors[err.name()] += 1
        if err.fatal():
            self.fatal = f"{err.name()}: {err.str()}"

    def outage(self, moment: float, partitions: list[int]) -> float:
        return longest_gap(self.acked_at, moment, partitions)


class GroupReader:
    """A consumer-group member reading the topic from a thread until stopped, recording every
    record in ``history`` (so what it reads must agree with what the final read finds) and, per
    partition, the highest producer sequence read: `read_since(seq)` says whether every
    partition delivered a record sent as ``seq`` or later (the group is consuming again)."""

    def __init__(self, brokers: list[Any], history: History, group: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(brokers),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
                "session.timeout.ms": 10_000,
                "error_cb": self._client_error,
            }
        )
        self.history = history
        self.read = 0
        self.last_read_seq: dict[int, int] = {p: -1 for p in range(PARTITIONS)}
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.consumer.subscribe([TOPIC])
        self._thread.start()

    def read_since(self, seq: int) -> bool:
        return all(last >= seq for last in self.last_read_seq.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self.consumer.consume(500, 0.5):
                if message.error() is not None:
                    self.errors[message.error().name()] += 1
                    continue
                partition, data = message.partition(), message.value()
                self.history.saw(TOPIC, partition, message.offset(), data)
                self.read += 1
                seq = int(data.rpartition(b":")[2])
                self.last_read_seq[partition] = max(self.last_read_seq[partition], seq)

    def _client_error(self, err: Any) -> None:
        self.errors[err.name()] += 1


def read_everything(
    brokers: list[Any], history: History, expected: int, timeout: float = 120
) -> int:
    """Read the topic from the beginning into ``history`` until ``expected`` records were read
    and nothing more came for 3 s (or ``timeout`` passed); returns how many were read."""
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
        deadline, quiet_since = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() < deadline:
            messages = [m for m in consumer.consume(1000, 0.5) if m.error() is None]
            if not messages:
                if read >= expected and time.monotonic() - quiet_since > 3:
                    break
                continue
            for message in messages:
                history.saw(TOPIC, message.partition(), message.offset(), message.value())
            read += len(messages)
            quiet_since = time.monotonic()
    finally:
        consumer.close()
    return read


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
