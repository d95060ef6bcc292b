"""ACLs with real clients against a real broker (issue 17; docs/design/security.md, section 6).

The broker runs with ``KAFSCALE_AUTHORIZER=acl`` and the listeners of test_security.py. The
administrator is ``User:admin`` (the first SCRAM user, a super user); the client under test is
``alice``, a SCRAM user created with AlterUserScramCredentials. ACLs are managed with Kafka's
``kafka-acls`` and with confluent-kafka's admin API; every client family sees Kafka's
authorization errors for what alice may not do, and is served for what an ACL allows.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .test_security import ADMIN, ADMIN_PASSWORD, Secure, java_sasl_configs, kcat_sasl, start_secure

pytestmark = pytest.mark.integration

ALICE, ALICE_PASSWORD = "alice", "alice-secret-1"


def admin_client(secure: Secure, user: str = ADMIN, password: str = ADMIN_PASSWORD) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {
            "bootstrap.servers": secure.address(secure.sasl_ssl),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.pki.ca_file),
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": password,
        }
    )


def allow(
    secure: Secure, principal: str, topic: str, *operations: str, prefixed: bool = False
) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            pattern,
            principal,
            "*",
            getattr(AclOperation, operation),
            AclPermissionType.ALLOW,
        )
        for operation in operations
    ]
    admin = admin_client(secure)  # held: the futures need the client alive
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result()


@pytest.fixture
def acl_broker(start_broker: Callable[..., Any], tmp_path: Path) -> Secure:
    secure = start_secure(
        start_broker,
        tmp_path,
        KAFSCALE_AUTHORIZER="acl",
        KAFSCALE_SUPER_USERS=f"User:{ADMIN}",
    )
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    upsert = UserScramCredentialUpsertion(
        ALICE, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE_PASSWORD.encode()
    )
    admin = admin_client(secure)  # held: the futures need the client alive
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result()
    return secure


def alice_kcat(kcat: str, secure: Secure, *args: str, stdin: str | None = None) -> Any:
    return kcat_sasl(kcat, secure, *args, user=ALICE, password=ALICE_PASSWORD, stdin=stdin)


@pytest.mark.compat("acl", "kcat")
def test_kcat_sees_authorization_errors_and_what_acls_allow(acl_broker: Secure, kcat: str) -> None:
    secure = acl_broker
    mine, theirs = f"mine-{uuid.uuid4().hex[:6]}", f"theirs-{uuid.uuid4().hex[:6]}"
    for topic in (mine, theirs):
        created = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="by-admin\n")
        assert created.returncode == 0, created.stderr
    refused = alice_kcat(kcat, secure, "-P", "-t", mine, stdin="x\n")
    assert "Topic authorization failed" in refused.stderr
    listing = json.loads(alice_kcat(kcat, secure, "-L", "-J").stdout)
    assert listing["topics"] == []  # nothing described: every topic left out
    allow(secure, f"User:{ALICE}", mine, "WRITE", "READ")
    produced = alice_kcat(kcat, secure, "-P", "-t", mine, stdin="by-alice\n")
    assert produced.returncode == 0, produced.stderr
    consumed = alice_kcat(kcat, secure, "-C", "-t", mine, "-o", "beginning", "-e")
    assert consumed.stdout.split() == ["by-admin", "by-alice"]
    listing = json.loads(alice_kcat(kcat, secure, "-L", "-J").stdout)
    assert [t["topic"] for t in listing["topics"]] == [mine]  # WRITE implies DESCRIBE
    denied = alice_kcat(kcat, secure, "-C", "-t", theirs, "-o", "beginning", "-e")
    assert "Topic authorization failed" in denied.stderr
    metrics = secure.broker.metrics_text()
    assert 'kafscale_authorization_denied_total{api="Metadata"}' in metrics


@pytest.mark.compat("acl", "confluent-kafka")
def test_confluent_kafka_gets_topic_authorization_failed(acl_broker: Secure) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    secure = acl_broker
    topic = f"ck-{uuid.uuid4().hex[:6]}"
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": secure.address(secure.sasl_ssl),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.pki.ca_file),
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": ALICE,
            "sasl.password": ALICE_PASSWORD,
            "message.timeout.ms": 15000,
        }
    )
    producer.produce(topic, b"x", on_delivery=lambda err, _: errors.append(err))
    producer.flush(30)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # Managing ACLs needs ALTER on the cluster. (DescribeAcls would answer
    # CLUSTER_AUTHORIZATION_FAILED too, but librdkafka drops that response's error code.)
    grant = AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        f"User:{ALICE}",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    as_alice = admin_client(secure, ALICE, ALICE_PASSWORD)
    with pytest.raises(KafkaException) as refused:
        for future in as_alice.create_acls([grant], request_timeout=30).values():
            future.result()
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


@pytest.mark.compat("acl", "aiokafka")
def test_aiokafka_gets_topic_authorization_failed(acl_broker: Secure) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TopicAuthorizationFailedError
    from aiokafka.helpers import create_ssl_context

    secure = acl_broker

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=secure.address(secure.sasl_ssl),
            security_protocol="SASL_SSL",
            ssl_context=create_ssl_context(cafile=str(secure.pki.ca_file)),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=ALICE,
            sasl_plain_password=ALICE_PASSWORD,
            request_timeout_ms=15000,
        )
        await producer.start()
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(f"aio-{uuid.uuid4().hex[:6]}", b"x")
        finally:
            await producer.stop()

    asyncio.run(run())


@pytest.mark.compat("acl", param="client_version", prefix="java-")
@pytest.mark.java
@pytest.mark.parametrize("client_version", ["3.9", "4"])
def test_java_gets_topic_authorization_failed(
    acl_broker: Secure, java_probe: Callable[..., Any], client_version: str
) -> None:
    topic = f"java-{uuid.uuid4().hex[:6]}"
    result = java_probe(
        client_version,
        "produce",
        "--bootstrap",
        acl_broker.address(acl_broker.sasl_ssl),
        "--topic",
        topic,
        "--count",
        "1",
        "--timeout-ms",
        "15000",
        *java_sasl_configs(acl_broker, ALICE, ALICE_PASSWORD),
        timeout=120,
    )
    assert result.returncode != 0
    assert "TopicAuthorizationException" in result.stdout + result.stderr


@pytest.mark.java
def test_kafka_acls_adds_lists_and_removes(
    acl_broker: Secure, kafka_tools: Any, tmp_path: Path, kcat: str
) -> None:
    secure = acl_broker
    created = kcat_sasl(kcat, secure, "-P", "-t", "team-orders", stdin="by-admin\n")
    assert created.returncode == 0, created.stderr
    properties = tmp_path / "admin.properties"
    configs = java_sasl_configs(secure)
    properties.write_text("\n".join(c for c in configs if c != "--config") + "\n")
    admin = [
        "--bootstrap-server",
        secure.address(secure.sasl_ssl),
        "--command-config",
        str(properties),
    ]
    kafka_tools.check(
        "acls",
        *admin,
        "--add",
        "--allow-principal",
        f"User:{ALICE}",
        "--operation",
        "Write",
        "--operation",
        "Describe",
        "--topic",
        "team-",
        "--resource-pattern-type",
        "prefixed",
    )
    listed = kafka_tools.check("acls", *admin, "--list")
    assert "ResourcePattern(resourceType=TOPIC, name=team-, patternType=PREFIXED)" in listed
    assert "(principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW)" in listed
    produced = alice_kcat(kcat, secure, "-P", "-t", "team-orders", stdin="x\n")
    assert produced.returncode == 0, produced.stderr  # the prefixed ACL allows it
    kafka_tools.check(
        "acls",
        *admin,
        "--remove",
        "--force",
        "--allow-principal",
        f"User:{ALICE}",
        "--operation",
        "Write",
        "--topic",
        "team-",
        "--resource-pattern-type",
        "prefixed",
    )
    listed = kafka_tools.check("acls", *admin, "--list")
    assert "operation=WRITE" not in listed and "operation=DESCRIBE" in listed
    refused = alice_kcat(kcat, secure, "-P", "-t", "team-orders", stdin="y\n")
    assert "Topic authorization failed" in refused.stderr


@pytest.mark.compat("acl", param="client")
@pytest.mark.parametrize("client", ["franz-go", "kafkajs"])
def test_drivers_get_topic_authorization_failed(acl_broker: Secure, kcat: str, client: str) -> None:
    from tests.harness.drivers import DriverSecurity
    from tests.harness.franz_go import FranzGo
    from tests.harness.kafkajs import KafkaJs
    from tests.harness.procs import HarnessError
    from tests.harness.roundtrip import Record

    secure = acl_broker
    topic = f"{client}-{uuid.uuid4().hex[:6]}"
    created = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="by-admin\n")
    assert created.returncode == 0, created.stderr
    security = DriverSecurity.scram_over_tls(secure.pki.ca_file, ALICE, ALICE_PASSWORD)
    kind = FranzGo if client == "franz-go" else KafkaJs
    try:
        as_alice = kind(security=security)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    with pytest.raises(HarnessError) as refused:
        as_alice.produce(secure.address(secure.sasl_ssl), topic, [Record(0, b"k", b"v")], "none")
    text = str(refused.value).lower()
    assert "authoriz" in text, refused.value


@pytest.mark.compat("acl", "kafka-python")
def test_kafka_python_gets_topic_authorization_failed(acl_broker: Secure, kcat: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    secure = acl_broker
    topic = f"kp-{uuid.uuid4().hex[:6]}"
    created = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="by-admin\n")
    assert created.returncode == 0, created.stderr
    producer = KafkaProducer(
        bootstrap_servers=secure.address(secure.sasl_ssl),
        security_protocol="SASL_SSL",
        ssl_cafile=str(secure.pki.ca_file),
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=ALICE,
        sasl_plain_password=ALICE_PASSWORD,
        max_block_ms=15000,
    )
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic, b"x").get(30)
    finally:
        producer.close(5)


def test_a_client_certificate_s_subject_is_the_principal_acls_name(
    acl_broker: Secure, kcat: str
) -> None:
    """mTLS: on the SSL listener a verified certificate's subject, in RFC 2253 form, is the
    principal (tests/harness/tls.py's client certificate: CN=kafscale)."""
    secure = acl_broker
    topic = f"mtls-{uuid.uuid4().hex[:6]}"
    created = kcat_sasl(kcat, secure, "-P", "-t", topic, stdin="by-admin\n")
    assert created.returncode == 0, created.stderr

    def listed() -> list[str]:
        result = subprocess.run(
            [
                kcat,
                "-b",
                secure.address(secure.ssl),
                "-X",
                "security.protocol=SSL",
                "-X",
                f"ssl.ca.location={secure.pki.ca_file}",
                "-X",
                f"ssl.certificate.location={secure.pki.client_cert}",
                "-X",
                f"ssl.key.location={secure.pki.client_key}",
                "-L",
                "-J",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return [t["topic"] for t in json.loads(result.stdout)["topics"]]

    assert listed() == []
    allow(secure, "User:CN=kafscale", topic, "DESCRIBE")
    assert listed() == [topic]
