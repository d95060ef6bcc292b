"""`kafscale metadata backup` and `restore` against a real etcd and MinIO (what the operator's
CronJob and restore init container run): a cluster's metadata lost with its etcd comes back from
a backup, and a broker started on it serves every record it had, at the same offsets."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from tests.harness.etcd import EtcdServer
from tests.harness.paths import ROOT

pytestmark = pytest.mark.integration

KAFSCALE = str(ROOT / ".venv" / "bin" / "kafscale")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    return subprocess.run(
        [KAFSCALE, "metadata", *args],
        env={**process_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def records(bootstrap: str, topic: str, count: int) -> list[tuple[int, int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "backup-check", "enable.auto.commit": False}
    )
    found: list[tuple[int, int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        for _ in range(200):
            for message in consumer.consume(100, timeout=0.5):
                if message.error() is None:
                    found.append((message.partition(), message.offset(), message.value()))
            if len(found) >= count:
                break
    finally:
        consumer.close()
    return sorted(found)


def test_metadata_lost_with_etcd_comes_back_from_a_backup(
    start_broker: Callable[..., Any], etcd_server: EtcdServer
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(backends="real", ready=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("kept", 2)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce("kept", f"value-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    before = records(broker.bootstrap, "kept", 100)
    assert len(before) == 100
    env = dict(broker.env)
    assert broker.terminate() == 0

    backed = run(env, "backup", "--prefix", "backups/")
    assert backed.returncode == 0, backed.stderr
    key = backed.stdout.split(" to ")[1].split()[0]
    assert key.startswith(f"backups/{env['KAFSCALE_S3_NAMESPACE']}-")

    # The etcd is lost: an empty one, as a new member set would be.
    root = f"/kafscale/{env['KAFSCALE_S3_NAMESPACE']}/"
    etcd_server.etcdctl("del", "--prefix", root)
    assert etcd_server.etcdctl("get", "--prefix", "--keys-only", root).strip() == ""

    restored = run(env, "restore", "--key", key)
    assert restored.returncode == 0, restored.stderr
    assert "restored" in restored.stdout
    again = run(env, "restore", "--key", key)
    assert again.returncode == 0 and "already restored" in again.stdout

    revived = start_broker(backends="real", env=env, ready=True)
    assert records(revived.bootstrap, "kept", 100) == before


def test_keep_deletes_older_backups_and_a_bad_key_fails_clearly(
    start_broker: Callable[..., Any],
) -> None:
    broker = start_broker(backends="real", ready=True)
    env = dict(broker.env)
    for _ in range(3):
        result = run(env, "backup", "--prefix", "keep/", "--keep", "2")
        assert result.returncode == 0, result.stderr
    s3 = boto3.client(
        "s3",
        endpoint_url=env["KAFSCALE_S3_ENDPOINT"],
        aws_access_key_id=env["KAFSCALE_S3_ACCESS_KEY"],
        aws_secret_access_key=env["KAFSCALE_S3_SECRET_KEY"],
        region_name=env["KAFSCALE_S3_REGION"],
    )
    listed = s3.list_objects_v2(Bucket=env["KAFSCALE_S3_BUCKET"], Prefix="keep/")
    assert len(listed.get("Contents", [])) == 2
    missing = run(env, "restore", "--key", "keep/no-such-backup.json.gz")
    assert missing.returncode == 1
    assert "kafscale metadata restore:" in missing.stderr
