"""KafscaleTopics and KafscaleUsers reconciled by a real `kafscale operator` against a real
KafScale broker (local processes: SASL_SSL with SCRAM, TLS from a test CA, ACLs on), through a
real Kubernetes API server. The KafscaleCluster resource describes that broker; the operator
reaches its bootstrap Service's address through KAFSCALE_OPERATOR_ADDRESS_MAP, as an operator
outside a cluster does through a port-forward.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import KubeControlPlane
from tests.harness.operator import OperatorProcess
from tests.harness.procs import wait_until
from tests.integration.operator_env import install_crds, install_operator_rbac

from .test_security import ADMIN, ADMIN_PASSWORD, Secure, start_secure

pytestmark = pytest.mark.integration

API = "/apis/kafscale.io/v1alpha1/namespaces/{ns}"


def _b64(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return base64.b64encode(data).decode()


def condition(obj: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


@pytest.fixture
def setup(
    kube: KubeControlPlane, start_broker: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[str, Secure, OperatorProcess]]:
    """A SASL_SSL broker with ACLs, a namespace describing it as KafscaleCluster ``kc`` (its
    admin and TLS Secrets), and the operator watching that namespace."""
    secure = start_secure(
        start_broker, tmp_path, KAFSCALE_AUTHORIZER="acl", KAFSCALE_SUPER_USERS=f"User:{ADMIN}"
    )
    api = kube.apiserver
    install_crds(kube)
    ns = f"res-{uuid.uuid4().hex[:8]}"
    api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    api.ok(
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "metadata": {"name": "kc-admin"},
            "data": {"username": _b64(ADMIN), "password": _b64(ADMIN_PASSWORD)},
        },
    )
    api.ok(
        "POST",
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "metadata": {"name": "kc-tls"},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": _b64(secure.pki.server_cert.read_bytes()),
                "tls.key": _b64(secure.pki.server_key.read_bytes()),
                "ca.crt": _b64(secure.pki.ca_file.read_bytes()),
            },
        },
    )
    cluster = {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafscaleCluster",
        "metadata": {"name": "kc"},
        "spec": {
            "storage": {"bucket": "kafscale-data"},
            "metadata": {"etcd": {"endpoints": ["etcd:2379"]}},
            "brokers": {
                "replicas": 1,
                "listeners": [{"name": "INTERNAL", "port": 9094, "tls": True, "sasl": True}],
                "tls": {"secretName": "kc-tls"},
                "authentication": {"adminSecret": "kc-admin"},
                "authorization": {"type": "acl"},
            },
        },
    }
    api.ok("POST", f"{API.format(ns=ns)}/kafscaleclusters", cluster)
    # A cluster with no SASL listener: its users cannot authenticate.
    plain = {
        **cluster,
        "metadata": {"name": "plain"},
        "spec": {**cluster["spec"], "brokers": {"replicas": 1}},
    }
    api.ok("POST", f"{API.format(ns=ns)}/kafscaleclusters", plain)
    token = install_operator_rbac(kube, ns)
    bootstrap = f"kc-bootstrap.{ns}.svc.cluster.local:9094"
    operator = OperatorProcess(
        tmp_path / "operator",
        api,
        token,
        [ns],
        env={"KAFSCALE_OPERATOR_ADDRESS_MAP": f"{bootstrap}={secure.address(secure.sasl_ssl)}"},
    )
    operator.start_first()
    try:
        yield ns, secure, operator
    finally:
        operator.stop()
        api.request("DELETE", f"/api/v1/namespaces/{ns}")


def client_config(secure: Secure, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": secure.address(secure.sasl_ssl),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.pki.ca_file),
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def describe_topic(secure: Secure, topic: str) -> Any:
    """(partitions, configs set on the topic), or (None, {}) when it does not exist. Through
    DescribeTopics, not Metadata: a Metadata request for a missing topic creates it."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(client_config(secure, ADMIN, ADMIN_PASSWORD))
    (future,) = admin.describe_topics(TopicCollection([topic])).values()
    try:
        found = future.result(30)
    except KafkaException as exc:
        if exc.args[0].name() == "UNKNOWN_TOPIC_OR_PART":
            return None, {}
        raise
    (configs_future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    configs = {name: entry.value for name, entry in configs_future.result(30).items()}
    return len(found.partitions), configs


def produce(secure: Secure, user: str, password: str, topic: str, count: int) -> str | None:
    """Produce ``count`` records; the delivery error's name, or None when all were delivered."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer(
        {**client_config(secure, user, password), "message.timeout.ms": 15000, "retries": 0}
    )
    for i in range(count):
        producer.produce(
            topic, f"record-{i}".encode(), on_delivery=lambda e, _m: e and errors.append(e.name())
        )
    producer.flush(30)
    return errors[0] if errors else None


def test_a_topic_is_created_grown_configured_and_deleted_when_asked(
    kube: KubeControlPlane, setup: tuple[str, Secure, OperatorProcess]
) -> None:
    ns, secure, _ = setup
    api = kube.apiserver
    path = f"{API.format(ns=ns)}/kafscaletopics"
    topic = {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafscaleTopic",
        "metadata": {"name": "orders"},
        "spec": {
            "cluster": "kc",
            "partitions": 3,
            "configs": {"retention.ms": "3600000", "max.message.bytes": "200000"},
            "deletionPolicy": "Delete",
        },
    }
    api.ok("POST", path, topic)
    found = api.wait_for(f"{path}/orders", lambda o: condition(o).get("status") == "True")
    assert found["status"]["topicName"] == "orders"
    assert [p["partition"] for p in found["status"]["partitions"]] == [0, 1, 2]
    partitions, configs = describe_topic(secure, "orders")
    assert partitions == 3
    assert (configs["retention.ms"], configs["max.message.bytes"]) == ("3600000", "200000")

    # Records show in the status (high watermarks, refreshed by the resync).
    assert produce(secure, ADMIN, ADMIN_PASSWORD, "orders", 30) is None
    found = api.wait_for(
        f"{path}/orders",
        lambda o: sum(p.get("highWatermark", 0) for p in o["status"]["partitions"]) == 30,
        what="high watermarks to add up to 30",
    )
    assert all(p["leader"] >= 0 for p in found["status"]["partitions"])
    assert all(p["logStartOffset"] == 0 for p in found["status"]["partitions"])

    # More partitions, one config changed, one removed (back to the default).
    api.ok(
        "PATCH",
        f"{path}/orders",
        {
            "spec": {
                "partitions": 5,
                "configs": {"retention.ms": "7200000", "max.message.bytes": None},
            }
        },
        "application/merge-patch+json",
    )

    def changed() -> Any:
        partitions, configs = describe_topic(secure, "orders")
        done = partitions == 5 and configs.get("retention.ms") == "7200000"
        return configs if done and configs.get("max.message.bytes") != "200000" else None

    wait_until(changed, timeout=60, what="5 partitions and the new configs", interval=0.5)

    # Deleted with the resource (deletionPolicy: Delete).
    api.ok("DELETE", f"{path}/orders")
    api.wait_gone(f"{path}/orders")
    wait_until(
        lambda: True if describe_topic(secure, "orders")[0] is None else None,
        timeout=60,
        what="the topic to be deleted",
    )


def test_a_retained_topic_outlives_its_resource(
    kube: KubeControlPlane, setup: tuple[str, Secure, OperatorProcess]
) -> None:
    ns, secure, _ = setup
    api = kube.apiserver
    path = f"{API.format(ns=ns)}/kafscaletopics"
    body = {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafscaleTopic",
        "metadata": {"name": "kept"},
        "spec": {"cluster": "kc", "topicName": "kept.events"},
    }
    api.ok("POST", path, body)
    api.wait_for(f"{path}/kept", lambda o: condition(o).get("status") == "True")
    assert describe_topic(secure, "kept.events")[0] == 1
    api.ok("DELETE", f"{path}/kept")
    api.wait_gone(f"{path}/kept")
    assert describe_topic(secure, "kept.events")[0] == 1  # Retain, the default

    # A topic of a cluster that does not exist: said in the status.
    api.ok(
        "POST",
        path,
        {**body, "metadata": {"name": "lost"}, "spec": {"cluster": "nope", "partitions": 2}},
    )
    lost = api.wait_for(f"{path}/lost", lambda o: condition(o).get("reason") == "ClusterNotFound")
    assert "no KafscaleCluster nope" in condition(lost)["message"]


def test_a_user_gets_credentials_and_acls_and_loses_them_when_deleted(
    kube: KubeControlPlane, setup: tuple[str, Secure, OperatorProcess]
) -> None:
    ns, secure, _ = setup
    api = kube.apiserver
    topics = f"{API.format(ns=ns)}/kafscaletopics"
    for name in ("payments", "secret"):
        api.ok(
            "POST",
            topics,
            {
                "apiVersion": "kafscale.io/v1alpha1",
                "kind": "KafscaleTopic",
                "metadata": {"name": name},
                "spec": {"cluster": "kc"},
            },
        )
        api.wait_for(f"{topics}/{name}", lambda o: condition(o).get("status") == "True")
    users = f"{API.format(ns=ns)}/kafscaleusers"
    api.ok(
        "POST",
        users,
        {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafscaleUser",
            "metadata": {"name": "app"},
            "spec": {
                "cluster": "kc",
                "authorization": {
                    "acls": [
                        {
                            "resource": {"type": "topic", "name": "payments"},
                            "operations": ["Write", "Describe"],
                        }
                    ]
                },
            },
        },
    )
    user = api.wait_for(f"{users}/app", lambda o: condition(o).get("status") == "True")
    assert user["status"]["secret"] == "app-credentials"
    assert user["status"]["acls"] == 2  # bindings: one per operation
    secret = api.ok("GET", f"/api/v1/namespaces/{ns}/secrets/app-credentials")
    username = base64.b64decode(secret["data"]["username"]).decode()
    password = base64.b64decode(secret["data"]["password"]).decode()
    assert username == "app"
    assert "credentialDigest" in user["status"] and password not in str(user["status"])

    assert produce(secure, username, password, "payments", 3) is None
    assert produce(secure, username, password, "secret", 1) == "TOPIC_AUTHORIZATION_FAILED"
    assert produce(secure, username, "wrong-password", "payments", 1) is not None

    # A new password in the Secret is stored within a resync; the old one stops working.
    api.ok(
        "PATCH",
        f"/api/v1/namespaces/{ns}/secrets/app-credentials",
        {"data": {"password": _b64("rotated-password-2")}},
        "application/merge-patch+json",
    )
    wait_until(
        lambda: (
            True if produce(secure, username, "rotated-password-2", "payments", 1) is None else None
        ),
        timeout=60,
        what="the rotated password to work",
        interval=1.0,
    )
    assert produce(secure, username, password, "payments", 1) is not None

    # Deleted: no credentials, no ACLs.
    api.ok("DELETE", f"{users}/app")
    api.wait_gone(f"{users}/app")
    assert produce(secure, username, "rotated-password-2", "payments", 1) is not None
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(client_config(secure, ADMIN, ADMIN_PASSWORD))
    listed = admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            "User:app",
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result()
    assert listed == []


def test_a_user_of_a_cluster_without_sasl_says_so(
    kube: KubeControlPlane, setup: tuple[str, Secure, OperatorProcess]
) -> None:
    ns, _, _ = setup
    api = kube.apiserver
    users = f"{API.format(ns=ns)}/kafscaleusers"
    api.ok(
        "POST",
        users,
        {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafscaleUser",
            "metadata": {"name": "nobody"},
            "spec": {"cluster": "plain"},
        },
    )
    user = api.wait_for(
        f"{users}/nobody", lambda o: condition(o).get("reason") == "AuthenticationNotEnabled"
    )
    assert condition(user)["status"] == "False"
    assert "has no SASL listener" in condition(user)["message"]
