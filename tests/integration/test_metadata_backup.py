"""`kafscale metadata backup` and `kafscale metadata restore` as the operator runs them (its
CronJob, its brokers' init container), against a real etcd, a real MinIO, real brokers and a real
Kafka client: a cluster whose etcd is lost -- replaced by a new, empty one -- comes back from a
backup with every record at the same offset and its consumer group's commits, and goes on from
there; ``--keep`` deletes only this cluster's oldest backups; a restore keeps to etcd's request
size limit."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafscale import config
from kafscale.metadata import open_metadata_store
from kafscale.metadata.backup import backup, read
from kafscale.metadata.records import Keys
from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer
from tests.harness.paths import ROOT

pytestmark = pytest.mark.integration

KAFSCALE = str(ROOT / ".venv" / "bin" / "kafscale")
TOPICS = {"orders": 3, "audit": 1}
GROUP = "readers"
FAST_GROUPS = {"KAFSCALE_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
# What a new broker pod does not inherit from the one before: its ports and local directory.
POD_LOCAL = ("KAFSCALE_DATA_DIR", "KAFSCALE_BROKER_PORT", "KAFSCALE_METRICS_PORT")

Record = tuple[str, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


def kafscale_metadata(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed command, with only the given KAFSCALE_* settings (as a pod has them)."""
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    return subprocess.run(
        [KAFSCALE, "metadata", *args],
        env={**process_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def backed_up_key(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    # "backed up N keys of NS to KEY"
    return result.stdout.splitlines()[0].rsplit(" to ", 1)[1]


@pytest.fixture
def new_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A new, empty etcd: what a cluster has after losing its own."""
    server = EtcdServer(tmp_path / "new-etcd", member_name="replacement")
    server.start_first()
    try:
        yield server
    finally:
        server.close()


def produce(bootstrap: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for topic, partitions in TOPICS.items():
        for i in range(120):
            producer.produce(
                topic,
                f"{topic}-value-{i}".encode(),
                key=f"key-{i % 7}".encode() if i % 5 else None,
                partition=i % partitions,
                headers=[("n", str(i).encode())],
            )
    assert producer.flush(60) == 0


def read_all(bootstrap: str, topic: str, count: int) -> list[Record]:
    """Every record of ``topic`` from offset 0, read by a real client."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    found: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(TOPICS[topic])])
        deadline = time.monotonic() + 90
        while len(found) < count:
            assert time.monotonic() < deadline, f"{topic}: read {len(found)} of {count} records"
            for message in consumer.consume(200, timeout=0.5):
                if message.error() is None:
                    found.append(
                        (
                            topic,
                            message.partition(),
                            message.offset(),
                            message.key(),
                            message.value(),
                            tuple(message.headers() or ()),
                        )
                    )
    finally:
        consumer.close()
    return sorted(found, key=lambda r: (r[1], r[2]))


def commit_half(bootstrap: str) -> dict[int, int]:
    """Read half of orders as a member of GROUP and commit; the committed offsets."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe(["orders"])
    read = 0
    try:
        deadline = time.monotonic() + 90
        while read < 60:
            assert time.monotonic() < deadline, f"read {read} of 60"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
        committed = consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert committed is not None
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def committed_offsets(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        asked = [TopicPartition("orders", p) for p in range(TOPICS["orders"])]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=60)}
    finally:
        consumer.close()


def test_a_cluster_whose_etcd_is_lost_comes_back_from_a_backup(
    new_etcd: EtcdServer, start_broker: Callable[..., Any], s3_server: MinioServer
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(FAST_GROUPS, backends="real", ready=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in TOPICS.items()]).values():
        future.result(60)
    produce(broker.bootstrap)
    before = {topic: read_all(broker.bootstrap, topic, 120) for topic in TOPICS}
    assert [len(records) for records in before.values()] == [120, 120]
    commits = commit_half(broker.bootstrap)
    assert sum(commits.values()) >= 60
    env = dict(broker.env)
    namespace = env["KAFSCALE_S3_NAMESPACE"]
    assert broker.terminate() == 0

    # What the CronJob runs.
    key = backed_up_key(kafscale_metadata(env, "backup", "--prefix", "metadata-backups/"))
    assert key.startswith(f"metadata-backups/{namespace}-") and key.endswith(".json.gz")
    stored = s3_server.client().get_object(Bucket=env["KAFSCALE_S3_BUCKET"], Key=key)
    header, entries = read(stored["Body"].read())
    assert header.namespace == namespace
    old = open_metadata_store(config.load(env))
    try:
        expected, _ = backup(old, namespace)
    finally:
        old.close()
    assert entries == read(expected)[1]  # every key the stopped cluster left, no more
    topic_keys = {k for k, _ in entries if k.startswith(Keys(namespace).topics)}
    assert {Keys(namespace).topic(t) for t in TOPICS} <= topic_keys

    # The etcd is lost: the cluster gets a new, empty one.
    restored_env = {**env, "KAFSCALE_ETCD_ENDPOINTS": new_etcd.endpoint}
    assert new_etcd.etcdctl("get", "--prefix", "--keys-only", "/").strip() == ""
    # What every broker pod's init container runs: one restores, the next finds it done.
    first = kafscale_metadata(restored_env, "restore", "--key", key)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"{key}: restored {header.keys} keys"
    second = kafscale_metadata(restored_env, "restore", "--key", key)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"{key}: already restored"
    new = open_metadata_store(config.load(restored_env))
    try:
        assert read(backup(new, namespace)[0])[1] == entries
    finally:
        new.close()

    # A new broker pod (new ports, no local state) on the new etcd serves everything.
    pod = {k: v for k, v in restored_env.items() if k not in POD_LOCAL}
    revived = start_broker(pod, backends="real", ready=True)
    assert {topic: read_all(revived.bootstrap, topic, 120) for topic in TOPICS} == before
    assert committed_offsets(revived.bootstrap) == {
        p: commits.get(p, -1001) for p in range(TOPICS["orders"])
    }
    # ... and goes on from where the backup left each partition, overwriting nothing.
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": revived.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce("audit", f"after-{i}".encode(), partition=0)
    assert producer.flush(60) == 0
    after = read_all(revived.bootstrap, "audit", 130)
    assert after[:120] == before["audit"]
    assert [(r[2], r[4]) for r in after[120:]] == [
        (120 + i, f"after-{i}".encode()) for i in range(10)
    ]
    assert revived.terminate() == 0  # while its etcd runs (new_etcd outlives start_broker)


def backend_env(etcd: EtcdServer, s3: MinioServer, bucket: str, namespace: str) -> dict[str, str]:
    """The settings the operator's ConfigMap gives a cluster's pods, for these servers."""
    return {
        "KAFSCALE_ETCD_ENDPOINTS": etcd.endpoint,
        "KAFSCALE_S3_BUCKET": bucket,
        "KAFSCALE_S3_ENDPOINT": s3.endpoint_url,
        "KAFSCALE_S3_ACCESS_KEY": s3.access_key,
        "KAFSCALE_S3_SECRET_KEY": s3.secret_key,
        "KAFSCALE_S3_REGION": s3.region,
        "KAFSCALE_S3_PATH_STYLE": "true",
        "KAFSCALE_S3_NAMESPACE": namespace,
    }


def listed(s3: MinioServer, bucket: str, prefix: str) -> list[str]:
    answer = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in answer.get("Contents", []))


def test_keep_deletes_only_this_clusters_oldest_backups(
    etcd_server: EtcdServer, s3_server: MinioServer, s3_bucket: str
) -> None:
    """Two clusters back up under one prefix, one's namespace the other's plus "-eu"."""
    namespace = f"keep-{uuid.uuid4().hex[:8]}"
    env = backend_env(etcd_server, s3_server, s3_bucket, namespace)
    eu = {**env, "KAFSCALE_S3_NAMESPACE": namespace + "-eu"}
    for cluster_env in (env, eu):
        etcd_server.put(
            f"/kafscale/{cluster_env['KAFSCALE_S3_NAMESPACE']}/cluster_id".encode(), b"c"
        )
    prefix = "metadata-backups/"
    theirs = [backed_up_key(kafscale_metadata(eu, "backup", "--prefix", prefix)) for _ in range(2)]
    ours = [
        backed_up_key(kafscale_metadata(env, "backup", "--prefix", prefix, "--keep", "2"))
        for _ in range(3)
    ]
    assert len(set(ours)) == 3 and ours == sorted(ours)  # names sort by time
    assert listed(s3_server, s3_bucket, prefix) == sorted(ours[1:] + theirs)
    last = kafscale_metadata(env, "backup", "--prefix", prefix, "--keep", "1")
    newest = backed_up_key(last)
    assert "deleted 2 older backups" in last.stdout
    assert listed(s3_server, s3_bucket, prefix) == sorted([newest, *theirs])
    # A restore of another namespace's backup, or of a missing one, fails saying why.
    refused = kafscale_metadata(env, "restore", "--key", theirs[0])
    assert refused.returncode == 1
    assert f"of namespace '{namespace}-eu', not '{namespace}'" in refused.stderr
    missing = kafscale_metadata(env, "restore", "--key", prefix + "no-such-backup.json.gz")
    assert missing.returncode == 1
    assert missing.stderr.startswith("kafscale metadata restore: ")


def test_a_restore_keeps_each_transaction_within_etcds_request_limit(
    etcd_server: EtcdServer, s3_server: MinioServer, s3_bucket: str
) -> None:
    """etcd refuses a request over --max-request-bytes (1.5 MiB by default): keys of 200 KiB,
    each written alone by the cluster, must not be restored 128 to a transaction."""
    namespace = f"large-{uuid.uuid4().hex[:8]}"
    env = backend_env(etcd_server, s3_server, s3_bucket, namespace)
    root = Keys(namespace).root
    written = {f"{root}topics/t{n}": bytes([n]) * (200 * 1024) for n in range(12)}
    store = open_metadata_store(config.load(env))
    try:
        for key, value in written.items():
            store.put(key, value)
    finally:
        store.close()
    key = backed_up_key(kafscale_metadata(env, "backup", "--prefix", "large/"))
    etcd_server.etcdctl("del", "--prefix", root)  # lost
    restored = kafscale_metadata(env, "restore", "--key", key)
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.strip() == f"{key}: restored 12 keys"
    store = open_metadata_store(config.load(env))
    try:
        back = {kv.key: kv.value for kv in store.get_prefix(root + "topics/")}
    finally:
        store.close()
    assert back == written
