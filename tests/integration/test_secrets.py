"""Secrets stay secret, checked on a real broker against etcd and MinIO with real clients.

The broker gets an S3 access key (environment), the secret key and an admin token (files, as a
mounted Kubernetes Secret), and:
- DescribeConfigs, from confluent-kafka's AdminClient and Kafka's own kafka-configs tool, shows
  the credentials as sensitive with no value, and neither a credential nor where the data lives;
- its log, its processes' command lines and its children's config file give nothing away;
- POST /flush is refused without the token (nothing is uploaded) and works with it;
- /readyz says which backend is down when MinIO stops, not the error (that is in the log).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer
from tests.unit.frontend.test_describe_configs_secrets import HIDDEN, SENSITIVE

pytestmark = pytest.mark.integration

ADMIN_TOKEN = "flush-token-5f0c2a9e71d4"
TOPIC = "kept"


class SecretMinio(MinioServer):
    """A MinIO of this module's own, with credentials nothing else could contain by chance
    (the secret has characters JSON and URLs escape), that the tests may stop."""

    access_key = "AKIAKAFSCALESECRETS7"
    secret_key = 'sEcReT/"k+e=y\\9f3b2c7d'


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretMinio]:
    server = SecretMinio(tmp_path_factory.mktemp("secret-minio"))
    server.start_first()
    try:
        yield server
    finally:
        server.close()


def broker_env(minio: SecretMinio, etcd: EtcdServer, files: Path, **extra: str) -> dict[str, str]:
    etcd.ensure_running()
    minio.ensure_running()
    secret_file = files / "s3-secret-key"
    secret_file.write_text(minio.secret_key + "\n")
    secret_file.chmod(0o600)
    return {
        "KAFSCALE_ETCD_ENDPOINTS": etcd.endpoint,
        "KAFSCALE_S3_BUCKET": minio.create_bucket(f"secrets-{uuid.uuid4().hex[:16]}"),
        "KAFSCALE_S3_ENDPOINT": minio.endpoint_url,
        "KAFSCALE_S3_REGION": minio.region,
        "KAFSCALE_S3_PATH_STYLE": "true",
        "KAFSCALE_S3_NAMESPACE": f"secrets-{uuid.uuid4().hex[:8]}",
        "KAFSCALE_S3_ACCESS_KEY": minio.access_key,
        "KAFSCALE_S3_SECRET_KEY_FILE": str(secret_file),
        **extra,
    }


def never_shown(broker: Any, minio: SecretMinio) -> list[str]:
    """What no client may be told: the credentials and where the data and metadata live."""
    env = broker.env
    return [
        minio.access_key,
        minio.secret_key,
        ADMIN_TOKEN,
        env["KAFSCALE_S3_BUCKET"],
        env["KAFSCALE_S3_NAMESPACE"],
        f"{minio.endpoint_url.split('//')[1]}",
        env["KAFSCALE_ETCD_ENDPOINTS"],
        env["KAFSCALE_DATA_DIR"],
    ]


def metrics_url(broker: Any) -> str:
    return f"http://127.0.0.1:{broker.metrics_port}"


def post_flush(broker: Any, authorization: str | None) -> int:
    headers = {} if authorization is None else {"Authorization": authorization}
    url = metrics_url(broker) + "/flush"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method="POST", headers=headers), timeout=90
        ) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def readyz(broker: Any) -> tuple[int, bytes]:
    url = metrics_url(broker) + "/readyz"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def high_watermark(bootstrap: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "secrets-test"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=20)
        return int(high)
    finally:
        consumer.close()


def stored_keys(minio: SecretMinio, broker: Any) -> list[str]:
    listed = minio.client().list_objects_v2(
        Bucket=broker.env["KAFSCALE_S3_BUCKET"], Prefix=broker.env["KAFSCALE_S3_NAMESPACE"]
    )
    return [item["Key"] for item in listed.get("Contents", [])]


def data_objects(keys: list[str]) -> list[str]:
    """The keys that hold records: write-ahead objects and segments."""
    return [key for key in keys if key.endswith((".wal", ".kfs"))]


def test_no_client_process_or_log_line_sees_a_secret(
    start_broker: Callable[..., Any],
    etcd_server: EtcdServer,
    minio: SecretMinio,
    kafka_tools: Any,
    tmp_path: Path,
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN)
    env = broker_env(
        minio,
        etcd_server,
        tmp_path,
        KAFSCALE_ADMIN_TOKEN_FILE=str(token_file),
        KAFSCALE_FLUSH_INTERVAL_MS="3600000",  # only the explicit flush uploads
    )
    broker = start_broker(env=env)
    broker.wait_ready()
    hidden = never_shown(broker, minio)

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1"})
    errors: list[object] = []

    def delivered(error: object, _message: object) -> None:
        errors.append(error)

    for i in range(100):
        producer.produce(TOPIC, b"%d" % i, partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert errors == [None] * 100  # all acknowledged, none yet uploaded

    # DescribeConfigs from librdkafka: credentials sensitive and null, backends absent.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "0")
    described = admin.describe_configs([resource], request_timeout=20)[resource].result(30)
    assert {name for name, entry in described.items() if entry.is_sensitive} == SENSITIVE
    for name in SENSITIVE:
        assert described[name].value is None
        assert all(s.value is None for s in described[name].synonyms.values())
    assert not set(described) & HIDDEN
    assert "log.segment.bytes" in described and "listeners" in described
    text = "\n".join(
        f"{entry.name}={entry.value} "
        + " ".join(f"{s.name}={s.value}" for s in entry.synonyms.values())
        for entry in described.values()
    )
    for piece in hidden:
        assert piece not in text

    # The same from Kafka's own tool (the Java admin client), every config included.
    shown = kafka_tools.check(
        "configs",
        "--bootstrap-server",
        broker.bootstrap,
        "--describe",
        "--entity-type",
        "brokers",
        "--entity-name",
        "0",
        "--all",
    )
    assert "kafscale.s3.secret.key=null sensitive=true" in shown, shown
    assert "kafscale.s3.access.key=null sensitive=true" in shown, shown
    assert not [name for name in HIDDEN if f"{name}=" in shown]
    for piece in hidden:
        assert piece not in shown

    # POST /flush: refused without the right token, and nothing is uploaded.
    assert post_flush(broker, None) == 401
    assert post_flush(broker, "Bearer not-the-admin-token-at-all") == 401
    assert post_flush(broker, f"Basic {ADMIN_TOKEN}") == 401
    assert high_watermark(broker.bootstrap) == 0
    assert not data_objects(stored_keys(minio, broker))
    # `kafscale flush` with the token from a file: everything is committed.
    result = subprocess.run(
        [sys.executable, "-m", "kafscale", "flush", "--metrics-url", metrics_url(broker)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KAFSCALE_ADMIN_TOKEN_FILE": str(token_file)},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["flushed"] is True, result.stdout
    assert high_watermark(broker.bootstrap) == 100
    # The flush uploads the buffered records as one write-ahead object (compacted into a
    # segment only much later).
    assert [key for key in data_objects(stored_keys(minio, broker)) if key.endswith(".wal")]

    # No command line holds a credential (ps shows them to every user); the children's config
    # file, which does, is the supervisor's alone.
    pids = [broker.pid, *broker.children()]
    assert len(pids) >= 5
    runtime_dirs = set()
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for credential in (minio.access_key, minio.secret_key, ADMIN_TOKEN):
            assert credential.encode() not in b" ".join(argv)
        if b"kafscale.supervisor.child" in argv:
            runtime_dirs.add(argv[argv.index(b"kafscale.supervisor.child") + 3].decode())
    [runtime_dir] = runtime_dirs
    assert stat.S_IMODE(os.stat(runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(Path(runtime_dir) / "config.json").st_mode) == 0o600

    assert broker.terminate() == 0
    log = broker.log_text()
    for credential in (minio.access_key, minio.secret_key, ADMIN_TOKEN):
        assert credential not in log
        assert json.dumps(credential)[1:-1] not in log  # nor escaped in a JSON line
    dumps = [
        json.loads(line)
        for line in log.splitlines()
        if line.startswith("{") and json.loads(line)["msg"] == "configuration"
    ]
    assert dumps  # one per start (the harness restarts a broker that lost a port race)
    for dump in dumps:
        masked = [dump["config"][f] for f in ("s3_access_key", "s3_secret_key", "admin_token")]
        assert masked == ["***"] * 3


def test_readyz_says_which_backend_is_down_not_its_error(
    start_broker: Callable[..., Any], etcd_server: EtcdServer, minio: SecretMinio, tmp_path: Path
) -> None:
    broker = start_broker(env=broker_env(minio, etcd_server, tmp_path))
    broker.wait_ready()
    assert post_flush(broker, f"Bearer {ADMIN_TOKEN}") == 403  # no token configured: disabled
    minio.stop()
    try:
        deadline = time.monotonic() + 60
        status, body = readyz(broker)
        while status == 200:
            assert time.monotonic() < deadline, "/readyz stayed ready with MinIO stopped"
            time.sleep(0.5)
            status, body = readyz(broker)
        assert status == 503
        problems = json.loads(body)["problems"]
        assert "objects backend is not reachable" in problems, problems
        for problem in problems:  # a name and a verdict; no error text of any library
            assert re.fullmatch(
                r"[\w-]+ (backend is not reachable|is not running|does not answer)", problem
            ), problem
        for piece in [*never_shown(broker, minio), "127.0.0.1", "http", "Error"]:
            assert piece.encode() not in body
        # The operator finds the details in the log.
        failures = [
            json.loads(line)
            for line in broker.log_text().splitlines()
            if '"backend check failed"' in line
        ]
        assert any(
            f["backend"] == "objects" and minio.endpoint_url in f["error"] for f in failures
        ), failures
    finally:
        minio.start()
    broker.wait_ready()
