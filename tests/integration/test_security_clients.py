"""SCRAM-SHA-512 over TLS for the client families tests/integration/test_security.py does not run
(issue 17; the "scram" row of the compatibility matrix): franz-go and kafkajs through their drivers
(tests/compat/go, tests/compat/node, with tests/harness/drivers.py's DriverSecurity) and
kafka-python in process and as a group member (tests/harness/group_consumer.py).

Each client, on the broker's SASL_SSL listener, creates a topic with its admin client, produces to
every partition, reads the records back in a consumer group that commits after processing, and
its admin client finds the group's offsets at the end of every partition; the drivers also read
by direct assignment. The same client with a wrong password is refused: the drivers report the
broker's message; kafka-python gives up bootstrapping, and reads the message only when the
broker's close does not overtake it (see its test), so the broker's counters are checked too.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.drivers import DriverSecurity
from tests.harness.franz_go import FranzGo
from tests.harness.groups import GroupConsumer, GroupConsumers, group_consumer_options
from tests.harness.kafkajs import KafkaJs
from tests.harness.procs import HarnessError
from tests.harness.roundtrip import Record

from .test_security import ADMIN, ADMIN_PASSWORD, FAILED, Secure, start_secure

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 60
DRIVERS: dict[str, type[FranzGo] | type[KafkaJs]] = {"franz-go": FranzGo, "kafkajs": KafkaJs}


@pytest.fixture
def secure(start_broker: Callable[..., Any], tmp_path: Path) -> Secure:
    return start_secure(start_broker, tmp_path)


def records() -> list[Record]:
    return [Record(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(RECORDS)]


def expected() -> set[tuple[int, int, str]]:
    """(partition, offset, value) of every record of `records()` in a fresh topic."""
    return {(i % PARTITIONS, i // PARTITIONS, f"v{i}") for i in range(RECORDS)}


def ends() -> list[int]:
    return [len(range(p, RECORDS, PARTITIONS)) for p in range(PARTITIONS)]


def driver(client: str, secure: Secure, password: str = ADMIN_PASSWORD) -> FranzGo | KafkaJs:
    security = DriverSecurity.scram_over_tls(secure.pki.ca_file, ADMIN, password)
    try:
        return DRIVERS[client](security=security)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


def kafka_python_options(secure: Secure, password: str = ADMIN_PASSWORD) -> dict[str, Any]:
    return {
        "bootstrap_servers": secure.address(secure.sasl_ssl),
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(secure.pki.ca_file),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": ADMIN,
        "sasl_plain_password": password,
    }


def read_in_a_group(member: GroupConsumer, topic: str) -> set[tuple[int, int, str]]:
    """(partition, offset, value) of what `member` (started with count=RECORDS) read, once it is
    done, each record once; it committed the end of every partition."""
    member.wait_for(lambda m: m.done, 120, "every record read")
    assert member.wait() == 0, member.report()
    assert member.done is not None and member.done.data["reason"] == "count", member.report()
    read = [(r.tp[1], r.offset, r.value or "") for r in member.records]
    assert len(read) == len(set(read)) == RECORDS, member.report()
    assert member.committed == {(topic, p): end for p, end in enumerate(ends())}, member.report()
    return set(read)


@pytest.mark.compat("scram", param="client")
@pytest.mark.parametrize("client", ["franz-go", "kafkajs"])
def test_drivers_scram_over_tls_in_a_group(
    secure: Secure, group_consumers: GroupConsumers, client: str
) -> None:
    bootstrap = secure.address(secure.sasl_ssl)
    topic, group = f"{client}-{uuid.uuid4().hex[:8]}", f"{client}-secure"
    tls = driver(client, secure)
    described = tls.admin(bootstrap, topic, PARTITIONS)
    assert described["created"] is None, described
    assert described["cluster"]["brokers"] == [
        {"id": 0, "host": "127.0.0.1", "port": secure.sasl_ssl}
    ]
    acks = tls.produce(bootstrap, topic, records(), "none")
    assert {(a.partition, a.offset, f"v{i}") for i, a in enumerate(acks)} == expected()
    direct = tls.consume(bootstrap, [topic], range(PARTITIONS), "earliest", RECORDS, 60)
    assert {(c.partition, c.offset, (c.value or b"").decode()) for c in direct} == expected()
    assert len(direct) == RECORDS

    options = group_consumer_options(bootstrap, [topic], group, count=RECORDS, timeout=150)
    member = GroupConsumer(f"{client}#secure", tls.group_argv(options))
    group_consumers.started.append(member)  # killed at teardown if it still runs
    assert read_in_a_group(member, topic) == expected()
    after = tls.admin(bootstrap, topic, PARTITIONS, group=group)
    assert after["created"] == "TOPIC_ALREADY_EXISTS"
    assert after["group"] == {"state": "Empty", "protocol_type": "consumer", "members": 0}
    offsets = [(o["topic"], o["partition"], o["offset"]) for o in after["offsets"]]
    assert offsets == [(topic, p, ends()[p]) for p in range(PARTITIONS)]


@pytest.mark.compat("scram", "kafka-python")
def test_kafka_python_scram_over_tls_in_a_group(
    secure: Secure, group_consumers: GroupConsumers
) -> None:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    topic, group = f"kp-{uuid.uuid4().hex[:8]}", "kp-secure"
    options = kafka_python_options(secure)
    admin = KafkaAdminClient(**options)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        producer = KafkaProducer(acks="all", **options)
        try:
            sent = [producer.send(topic, r.value, r.key, partition=r.partition) for r in records()]
            producer.flush(30)
            metadata = [future.get(30) for future in sent]
        finally:
            producer.close(10)
        assert {(m.partition, m.offset, f"v{i}") for i, m in enumerate(metadata)} == expected()

        # The member takes the client's keyword arguments as --config, dots for underscores.
        configs = {k.replace("_", "."): v for k, v in options.items() if k != "bootstrap_servers"}
        member = group_consumers.start(
            "kafka-python",
            options["bootstrap_servers"],
            [topic],
            group,
            count=RECORDS,
            timeout=150,
            configs=configs,
        )
        assert read_in_a_group(member, topic) == expected()
        committed = admin.list_group_offsets(group)[group]
        found = sorted((tp.partition, meta.offset) for tp, meta in committed.items())
        assert found == list(enumerate(ends()))
    finally:
        admin.close()


@pytest.mark.compat("scram", param="client")
@pytest.mark.parametrize("client", ["franz-go", "kafkajs"])
def test_drivers_with_a_wrong_password_are_refused(secure: Secure, client: str) -> None:
    wrong = driver(client, secure, password="not-the-password")
    started = time.monotonic()
    with pytest.raises(HarnessError) as refused:
        wrong.admin(secure.address(secure.sasl_ssl), "never-created", 1)
    assert f"{FAILED} SCRAM-SHA-512" in str(refused.value)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("client", ["franz-go", "kafkajs"])
def test_drivers_refuse_settings_their_protocol_does_not_use(client: str) -> None:
    # No broker: the driver stops before it connects.
    for security, complaint in (
        (DriverSecurity("SSL", username=ADMIN), "has no SASL"),
        (DriverSecurity("SASL_PLAINTEXT", ca_file="/nowhere.pem", username=ADMIN), "has no TLS"),
        (DriverSecurity("SASL_SSL"), "SASL_USERNAME is required"),
        (DriverSecurity("KERBEROS"), "SECURITY_PROTOCOL=KERBEROS"),
    ):
        with pytest.raises(HarnessError, match=complaint):
            DRIVERS[client](security=security).admin("127.0.0.1:9", "t", 1)


@pytest.mark.compat("scram", "kafka-python")
def test_kafka_python_with_a_wrong_password_is_refused(
    secure: Secure, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    # kafka-python 3.0 retries a failed bootstrap connection until its bootstrap timeout, then
    # raises "Unable to bootstrap", logging why each attempt failed. The broker answers the
    # refused SaslAuthenticate and closes 100 ms later (Kafka's
    # connection.failed.authentication.delay.ms), so the client reads the answer: an attempt
    # logs SaslAuthenticationFailedError with Kafka's message. (kafka-python drops an answer
    # that arrives in the same read as the close: "socket disconnected", accepted below for an
    # attempt on a busy machine, but at least one attempt must carry the refusal.) The broker's
    # counters say every attempt was refused.
    caplog.set_level(logging.WARNING, logger="kafka.net.manager")
    options = kafka_python_options(secure, password="not-the-password")
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(
            bootstrap_timeout_ms=5000,
            reconnect_backoff_ms=20,
            reconnect_backoff_max_ms=100,
            **options,
        )
    assert time.monotonic() - started < 30
    attempts = [r.getMessage() for r in caplog.records if "Bootstrap connection" in r.getMessage()]
    assert attempts
    refused = [a for a in attempts if "SaslAuthenticationFailedError" in a]
    assert refused, attempts
    assert all(f"{FAILED} SCRAM-SHA-512" in a for a in refused), attempts
    closed = [a for a in attempts if "socket disconnected" in a]
    # What the bootstrap timeout cut short (on a busy machine: the last attempt).
    cut = [a for a in attempts if "timed out" in a or "Timeout" in a]
    assert len(refused) + len(closed) + len(cut) == len(attempts), [
        a for a in attempts if a not in refused + closed + cut
    ]
    counted = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in secure.broker.metrics_text().splitlines()
        if line.startswith("kafscale_sasl_authentications_total{")
    }
    series = 'kafscale_sasl_authentications_total{listener="SECURE",mechanism="SCRAM-SHA-512",'
    # A refusal per attempt that was not cut short (and maybe one the client no longer awaited).
    assert counted.get(series + 'result="failed"}', 0) >= len(refused) + len(closed), counted
    assert series + 'result="ok"}' not in counted
