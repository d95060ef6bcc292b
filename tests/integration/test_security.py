"""Listeners, TLS and SASL with real clients against a real broker (issue 17;
docs/design/security.md).

One broker serves four listeners: PLAIN (PLAINTEXT, the harness's port), SECURE (SASL_SSL),
SSLONLY (SSL, client certificates requested) and SASLPLAIN (SASL_PLAINTEXT), with SCRAM-SHA-512,
SCRAM-SHA-256 and PLAIN enabled and a first admin user from the environment. Certificates come
from tests/harness/tls.py. Each client family authenticates with SCRAM over TLS, produces and
consumes in a group; a wrong password is refused with Kafka's message; users are managed with
Kafka's kafka-configs; a replaced certificate is served without a restart.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from kafscale.protocol import codec
from tests.harness.procs import free_port
from tests.harness.tls import Pki, make_pki

from .wire import Wire

pytestmark = pytest.mark.integration

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret-0"
FAILED = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism"
)


@dataclass
class Secure:
    broker: Any
    pki: Pki
    sasl_ssl: int
    ssl: int
    sasl_plaintext: int

    def address(self, port: int) -> str:
        return f"127.0.0.1:{port}"


def start_secure(
    start_broker: Callable[..., Any], directory: Path, backends: str = "embedded", **env: str
) -> Secure:
    pki = make_pki(directory / "pki")
    # The broker reads the files it is given; tests that replace them replace these copies.
    live = directory / "live"
    live.mkdir()
    for name in ("server.pem", "server-key.pem"):
        shutil.copy(directory / "pki" / name, live / name)
    ports = {name: free_port() for name in ("SECURE", "SSLONLY", "SASLPLAIN")}
    plain = str(free_port())
    listeners = [f"PLAIN://127.0.0.1:{plain}"]
    listeners += [f"{name}://127.0.0.1:{port}" for name, port in ports.items()]
    settings = {
        "KAFSCALE_BROKER_PORT": plain,
        "KAFSCALE_METRICS_PORT": str(free_port()),
        "KAFSCALE_LISTENERS": ",".join(listeners),
        "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": (
            "PLAIN:PLAINTEXT,SECURE:SASL_SSL,SSLONLY:SSL,SASLPLAIN:SASL_PLAINTEXT"
        ),
        "KAFSCALE_SSL_CERT_FILE": str(live / "server.pem"),
        "KAFSCALE_SSL_KEY_FILE": str(live / "server-key.pem"),
        "KAFSCALE_SSL_CA_FILE": str(pki.ca_file),
        "KAFSCALE_SSL_CLIENT_AUTH": "requested",
        "KAFSCALE_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
        "KAFSCALE_SASL_ADMIN_USER": ADMIN,
        "KAFSCALE_SASL_ADMIN_PASSWORD": ADMIN_PASSWORD,
        **env,
    }
    broker = start_broker(backends=backends, env=settings)
    broker.wait_ready()
    return Secure(broker, pki, ports["SECURE"], ports["SSLONLY"], ports["SASLPLAIN"])


@pytest.fixture
def secure(start_broker: Callable[..., Any], tmp_path: Path) -> Secure:
    return start_secure(start_broker, tmp_path)


def kcat_sasl(
    kcat: str,
    secure: Secure,
    *args: str,
    user: str = ADMIN,
    password: str = ADMIN_PASSWORD,
    mechanism: str = "SCRAM-SHA-512",
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            kcat,
            "-b",
            secure.address(secure.sasl_ssl),
            "-X",
            "security.protocol=SASL_SSL",
            "-X",
            f"ssl.ca.location={secure.pki.ca_file}",
            "-X",
            f"sasl.mechanisms={mechanism}",
            "-X",
            f"sasl.username={user}",
            "-X",
            f"sasl.password={password}",
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def java_sasl_configs(
    secure: Secure, user: str = ADMIN, password: str = ADMIN_PASSWORD
) -> list[str]:
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )
    configs = [
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        f"sasl.jaas.config={jaas}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={secure.pki.ca_file}",
    ]
    return [arg for config in configs for arg in ("--config", config)]


@pytest.mark.compat("scram", "kcat")
@pytest.mark.parametrize("backends", ["embedded", "real"])
def test_kcat_scram_over_tls_produces_and_consumes(
    start_broker: Callable[..., Any], tmp_path: Path, kcat: str, backends: str
) -> None:
    secure = start_secure(start_broker, tmp_path, backends)
    topic = f"scram-{uuid.uuid4().hex[:8]}"
    lines = [f"secret-{i}" for i in range(50)]
    produced = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="\n".join(lines) + "\n")
    assert produced.returncode == 0, produced.stderr
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        consumed = kcat_sasl(
            kcat, secure, "-C", "-t", topic, "-o", "beginning", "-e", mechanism=mechanism
        )
        assert consumed.returncode == 0, consumed.stderr
        assert consumed.stdout.split() == lines, mechanism
    # Each listener describes the brokers at its own endpoint.
    listing = json.loads(kcat_sasl(kcat, secure, "-L", "-J").stdout)
    assert [(b["id"], b["name"]) for b in listing["brokers"]] == [
        (0, secure.address(secure.sasl_ssl))
    ]
    plain = subprocess.run(
        [kcat, "-L", "-J", "-b", secure.broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [b["name"] for b in json.loads(plain.stdout)["brokers"]] == [secure.broker.bootstrap]


def test_a_wrong_password_or_unknown_user_is_refused(secure: Secure, kcat: str) -> None:
    for user, password in ((ADMIN, "not-the-password"), ("nobody", ADMIN_PASSWORD)):
        refused = kcat_sasl(kcat, secure, "-L", "-m", "5", user=user, password=password)
        assert refused.returncode != 0
        assert f"{FAILED} SCRAM-SHA-512" in refused.stderr
    refused = kcat_sasl(kcat, secure, "-L", "-m", "5", password="wrong", mechanism="PLAIN")
    assert f"{FAILED} PLAIN" in refused.stderr
    log = secure.broker.log_text()
    # One line per client address per 10 s: the first failure is logged with its user name.
    assert "SASL authentication failed" in log and "user 'admin'" in log
    assert "not-the-password" not in log and 'wrong"' not in log
    metrics = secure.broker.metrics_text()
    assert (
        'kafscale_sasl_authentications_total{listener="SECURE",mechanism="SCRAM-SHA-512",result="failed"}'
        in metrics
    )


@pytest.mark.compat("scram", "confluent-kafka")
def test_confluent_kafka_scram_over_tls_in_a_group(secure: Secure) -> None:
    from confluent_kafka import Consumer, Producer

    common = {
        "bootstrap.servers": secure.address(secure.sasl_ssl),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.pki.ca_file),
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": ADMIN,
        "sasl.password": ADMIN_PASSWORD,
    }
    topic = f"ck-{uuid.uuid4().hex[:8]}"
    producer = Producer(common)
    for i in range(30):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**common, "group.id": "ck-secure", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < 30 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert values == [f"v{i}".encode() for i in range(30)]


@pytest.mark.compat("scram", "aiokafka")
def test_aiokafka_scram_over_tls_in_a_group(secure: Secure) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> list[bytes]:
        common: dict[str, Any] = {
            "bootstrap_servers": secure.address(secure.sasl_ssl),
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=str(secure.pki.ca_file)),
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": ADMIN,
            "sasl_plain_password": ADMIN_PASSWORD,
        }
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait(topic, f"a{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, group_id="aio-secure", auto_offset_reset="earliest", **common
        )
        await consumer.start()
        try:
            values: list[bytes] = []
            async with asyncio.timeout(60):
                async for message in consumer:
                    assert message.value is not None
                    values.append(message.value)
                    if len(values) == 20:
                        break
            await consumer.commit()
            return values
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(20)]


@pytest.mark.compat("scram", param="client_version", prefix="java-")
@pytest.mark.java
@pytest.mark.parametrize("client_version", ["3.9", "4"])
def test_java_scram_over_tls_in_a_group(
    secure: Secure, java_probe: Callable[..., Any], client_version: str
) -> None:
    topic = f"java-{client_version.replace('.', '')}-{uuid.uuid4().hex[:6]}"
    bootstrap = ["--bootstrap", secure.address(secure.sasl_ssl)]
    produced = java_probe(
        client_version,
        "produce",
        *bootstrap,
        "--topic",
        topic,
        "--count",
        "200",
        *java_sasl_configs(secure),
        timeout=180,
    )
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["acknowledged"]["count"] == 200
    consumed = java_probe(
        client_version,
        "group-consume",
        *bootstrap,
        "--topic",
        topic,
        "--group",
        f"g-{topic}",
        "--count",
        "200",
        *java_sasl_configs(secure),
        timeout=180,
    )
    assert consumed.returncode == 0, consumed.stderr
    events = [json.loads(line) for line in consumed.stdout.splitlines() if line.startswith("{")]
    done = [e for e in events if e.get("event") == "done"]
    assert done and done[0]["consumed"] == 200, consumed.stdout[-2000:]
    assert any(e.get("event") == "committed" for e in events)


@pytest.mark.java
def test_kafka_configs_manages_scram_users(
    secure: Secure, kafka_tools: Any, kcat: str, tmp_path: Path
) -> None:
    properties = tmp_path / "admin.properties"
    properties.write_text(
        "\n".join(config for config in java_sasl_configs(secure) if config != "--config") + "\n"
    )
    admin = [
        "--bootstrap-server",
        secure.address(secure.sasl_ssl),
        "--command-config",
        str(properties),
    ]
    kafka_tools.check(
        "configs",
        *admin,
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        "bob",
        "--add-config",
        "SCRAM-SHA-512=[password=bob-secret],SCRAM-SHA-256=[iterations=8192,password=bob-256]",
    )
    described = kafka_tools.check("configs", *admin, "--describe", "--entity-type", "users")
    assert (
        "SCRAM credential configs for user-principal 'bob' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"
    ) in described
    assert "user-principal 'admin'" in described
    assert kcat_sasl(kcat, secure, "-L", user="bob", password="bob-secret").returncode == 0
    assert (
        kcat_sasl(
            kcat, secure, "-L", user="bob", password="bob-256", mechanism="SCRAM-SHA-256"
        ).returncode
        == 0
    )
    kafka_tools.check(
        "configs",
        *admin,
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        "bob",
        "--delete-config",
        "SCRAM-SHA-512",
    )
    refused = kcat_sasl(kcat, secure, "-L", "-m", "5", user="bob", password="bob-secret")
    assert refused.returncode != 0 and FAILED in refused.stderr
    described = kafka_tools.check(
        "configs", *admin, "--describe", "--entity-type", "users", "--entity-name", "bob"
    )
    assert "are SCRAM-SHA-256=iterations=8192" in described


def test_before_authentication_only_the_sasl_requests_are_served(secure: Secure, kcat: str) -> None:
    address = ("127.0.0.1", secure.sasl_plaintext)
    metadata = codec.build(
        load_request_schema(3, 12),
        topics=None,
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    with Wire(address) as wire:
        wire.send(metadata, correlation_id=7)
        assert wire.is_closed_by_peer()
    with Wire(address) as wire:
        versions = codec.build(
            load_request_schema(18, 3), client_software_name="t", client_software_version="1"
        )
        wire.send(versions, correlation_id=1)
        _, answer = wire.read_response(load_response_schema(18, 3))
        assert answer.error_code == 0 and any(k.api_key == 36 for k in answer.api_keys)
        wire.send(codec.build(load_request_schema(17, 1), mechanism="GSSAPI"), correlation_id=2)
        _, handshake = wire.read_response(load_response_schema(17, 1))
        assert handshake.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert set(handshake.mechanisms) == {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"}
        assert wire.is_closed_by_peer()
    assert "before SASL authentication completed" in secure.broker.log_text()
    # Nothing was created, and a client that authenticates is served as before.
    listing = kcat_sasl(kcat, secure, "-L", "-J")
    assert json.loads(listing.stdout)["topics"] == []


def test_client_certificates_on_the_ssl_listener(secure: Secure, kcat: str) -> None:
    pki = secure.pki
    base = [kcat, "-b", secure.address(secure.ssl), "-L", "-m", "10"]
    tls = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca_file}"]
    with_cert = [
        "-X",
        f"ssl.certificate.location={pki.client_cert}",
        "-X",
        f"ssl.key.location={pki.client_key}",
    ]
    for extra in ([], with_cert):  # requested: with or without a certificate
        result = subprocess.run([*base, *tls, *extra], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
    # A certificate no trusted CA signed fails the handshake (and is counted).
    other = Path(pki.client_cert).parent.parent / "other"
    stranger = make_pki(other)
    result = subprocess.run(
        [
            *base,
            *tls,
            "-X",
            f"ssl.certificate.location={stranger.client_cert}",
            "-X",
            f"ssl.key.location={stranger.client_key}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        'kafscale_tls_handshake_failures_total{listener="SSLONLY"}' in secure.broker.metrics_text()
    )


def test_a_replaced_certificate_is_served_without_a_restart(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    secure = start_secure(start_broker, tmp_path, KAFSCALE_SSL_RELOAD_INTERVAL_MS="1000")
    fresh = make_pki(tmp_path / "fresh")

    def served(ca_file: Path) -> bytes:
        context = ssl.create_default_context(cafile=str(ca_file))
        with (
            socket.create_connection(("127.0.0.1", secure.ssl), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            certificate = tls.getpeercert(binary_form=True)
            assert certificate is not None
            return certificate

    before = served(secure.pki.ca_file)
    live = tmp_path / "live"
    shutil.copy(fresh.server_key, live / "server-key.pem")
    shutil.copy(fresh.server_cert, live / "server.pem")
    wanted = ssl.PEM_cert_to_DER_cert(fresh.server_cert.read_text())
    deadline = time.monotonic() + 30
    while True:
        try:
            if served(fresh.ca_file) == wanted:
                break
        except ssl.SSLError:
            pass  # still the old certificate, which the fresh CA does not trust
        assert time.monotonic() < deadline, "the new certificate was not served"
        time.sleep(0.5)
    assert before != wanted
    assert "TLS certificate reloaded" in secure.broker.log_text()
    assert 'kafscale_tls_reloads_total{result="loaded"}' in secure.broker.metrics_text()


@pytest.mark.java
def test_java_re_authenticates_when_its_session_expires(
    start_broker: Callable[..., Any], tmp_path: Path, java_probe: Callable[..., Any], kcat: str
) -> None:
    """KIP-368: with KAFSCALE_CONNECTIONS_MAX_REAUTH_MS the broker gives each SASL session a
    lifetime; the Java client re-authenticates on its connection before it ends, and keeps
    producing without an error."""
    secure = start_secure(start_broker, tmp_path, KAFSCALE_CONNECTIONS_MAX_REAUTH_MS="1500")
    topic = f"reauth-{uuid.uuid4().hex[:6]}"
    created = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="first\n")
    assert created.returncode == 0, created.stderr
    result = java_probe(
        "4",
        "produce-load",
        "--bootstrap",
        secure.address(secure.sasl_ssl),
        "--topic",
        topic,
        "--partitions",
        "1",
        "--rate",
        "40",
        "--duration-ms",
        "8000",
        "--stdin",
        "ignore",
        *java_sasl_configs(secure),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    done = [e for e in events if e.get("event") == "done"]
    assert done and done[0]["acked"] == done[0]["sent"] > 100, done
    assert not [e for e in events if e.get("event") == "send-failed"]
    sasl = [
        line
        for line in secure.broker.metrics_text().splitlines()
        if line.startswith("kafscale_sasl_authentications_total{")
    ]
    reauthenticated = [
        float(line.rpartition(" ")[2]) for line in sasl if 'result="reauthenticated"' in line
    ]
    # Several sessions of 1.5 s end in 8 s. The client re-authenticates between 85 and 95 % of a
    # session; one it starts late (a stalled JVM on a loaded machine) meets a closed connection
    # and authenticates again on a new one, as on Kafka: not an error, but not counted here.
    assert sum(reauthenticated) >= 1, (sasl, secure.broker.log_text()[-3000:])
    assert not [line for line in sasl if 'result="failed"' in line], sasl


def test_hostile_sasl_input_is_refused_and_hurts_no_one(secure: Secure, kcat: str) -> None:
    """Garbage tokens, an oversize frame before authentication and a flood of failed handshakes:
    each connection is answered or closed with a log line, and an honest client is served
    throughout (docs/design/security.md, section 8)."""
    address = ("127.0.0.1", secure.sasl_plaintext)
    handshake = codec.build(load_request_schema(17, 1), mechanism="SCRAM-SHA-512")
    with Wire(address) as wire:
        wire.send(handshake, correlation_id=1)
        assert wire.read_response(load_response_schema(17, 1))[1].error_code == 0
        garbage = codec.build(load_request_schema(36, 2), auth_bytes=b"\xff\x00not scram" * 50)
        wire.send(garbage, correlation_id=2)
        _, refused = wire.read_response(load_response_schema(36, 2))
        assert refused.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert wire.is_closed_by_peer()
    with Wire(address) as wire:
        wire.send_raw(struct.pack(">i", 600 * 1024) + b"\x00\x24\x00\x02")  # > 512 KiB
        assert wire.is_closed_by_peer()
    for _ in range(100):
        with Wire(address) as wire:
            wire.send(handshake, correlation_id=1)
            wire.read_response(load_response_schema(17, 1))
            wire.send(codec.build(load_request_schema(36, 2), auth_bytes=b"x"), correlation_id=2)
            wire.read_response(load_response_schema(36, 2))
    listing = kcat_sasl(kcat, secure, "-L", "-J")
    assert listing.returncode == 0, listing.stderr
    assert secure.broker.running
    log = secure.broker.log_text()
    assert "before authentication exceeds the maximum" in log
    assert log.count("SASL authentication failed") < 20  # one line per address per 10 s
