"""The harness itself: real etcd, real MinIO, the Java probe, kcat and the broker fixture.

The broker-fixture tests run a stand-in supervisor (a few lines below) where they need a broker
that misbehaves on purpose; one test runs the real `kafscale serve` on the real backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NoReturn

import pytest

from tests.harness.broker import BrokerFactory
from tests.harness.clients import JAVA_CLIENT_VERSIONS, JavaProbe
from tests.harness.etcd import EtcdServer
from tests.harness.history import History
from tests.harness.java_load import JavaLoads
from tests.harness.minio import MinioServer
from tests.harness.procs import free_port, read_proc

pytestmark = pytest.mark.integration


# --- etcd --------------------------------------------------------------------------------------


def test_etcd_keys_survive_stop_and_start(etcd_server: EtcdServer) -> None:
    key, value = f"harness/{uuid.uuid4().hex}".encode(), b"bar"
    etcd_server.put(key, value)
    assert etcd_server.get(key) == value
    endpoint = etcd_server.endpoint
    try:
        etcd_server.stop()  # etcd re-raises SIGTERM: exit status -15
        assert not etcd_server.running
    finally:
        etcd_server.start()
    assert etcd_server.endpoint == endpoint
    assert etcd_server.get(key) == value


def test_etcd_keys_survive_a_kill(etcd_server: EtcdServer) -> None:
    key = f"harness/{uuid.uuid4().hex}".encode()
    etcd_server.put(key, b"acknowledged before the crash")
    try:
        etcd_server.kill()
    finally:
        etcd_server.start()
    assert etcd_server.get(key) == b"acknowledged before the crash"


def test_etcdctl_talks_to_the_server(etcd_server: EtcdServer) -> None:
    key = f"harness/{uuid.uuid4().hex}"
    etcd_server.put(key.encode(), b"from-http")
    result = subprocess.run(
        ["etcdctl", f"--endpoints={etcd_server.url}", "get", key, "--print-value-only"],
        env={**os.environ, "ETCDCTL_API": "3"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout.strip() == "from-http"


# --- MinIO -------------------------------------------------------------------------------------


def test_minio_objects_survive_stop_and_start(s3_server: MinioServer, s3_bucket: str) -> None:
    body = os.urandom(64 * 1024)
    s3_server.client().put_object(Bucket=s3_bucket, Key="ns/t/0/segment.kfs", Body=body)
    try:
        s3_server.stop()
        assert not s3_server.running
    finally:
        s3_server.start()
    stored = s3_server.client().get_object(Bucket=s3_bucket, Key="ns/t/0/segment.kfs")
    assert stored["Body"].read() == body


def test_each_s3_bucket_is_fresh_and_empty(s3_server: MinioServer, s3_bucket: str) -> None:
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 0
    assert s3_bucket in {b["Name"] for b in client.list_buckets()["Buckets"]}


# --- real clients ------------------------------------------------------------------------------


@pytest.mark.java
@pytest.mark.parametrize("version_label", JAVA_CLIENT_VERSIONS)
def test_java_probe_runs_each_kafka_clients_version(
    java_probe: JavaProbe, version_label: str
) -> None:
    info = java_probe.json(version_label, "version")
    assert info["kafkaClients"].startswith(f"{version_label}.")
    assert info["java"].startswith("17")


@pytest.mark.java
def test_java_probe_reports_a_failure_on_stderr(java_probe: JavaProbe) -> None:
    result = java_probe(
        "4", "describe-cluster", "--bootstrap", f"127.0.0.1:{free_port()}", "--timeout-ms", "1500"
    )
    assert result.returncode == 1
    assert result.stdout == ""
    error = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("{")))
    assert error["error"] == "org.apache.kafka.common.errors.TimeoutException"


@pytest.mark.java
def test_the_java_load_records_each_acknowledgement_and_stops_when_told(
    start_broker: BrokerFactory, java_load: JavaLoads
) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = start_broker(ready=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("load", 3, 1)])["load"].result(timeout=30)
    history = History()
    load = java_load(broker.bootstrap, "load", 3, history, "java")
    load.more(300)
    load.stop()  # closes its stdin
    assert load.done == {
        "event": "done", "sent": load.acked, "acked": load.acked, "failed": 0, "reason": "stdin"
    }  # fmt: skip
    assert len(history.acked) == load.acked >= 300
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "load-reader"})
    try:
        consumer.assign([TopicPartition("load", p, OFFSET_BEGINNING) for p in range(3)])
        deadline = time.monotonic() + 60
        while (read := sum(len(r) for r in history.read.values())) < load.acked:
            assert time.monotonic() < deadline, f"{read} of {load.acked} read"
            for message in consumer.consume(500, timeout=1):
                if message.error() is None:
                    history.saw("load", message.partition(), message.offset(), message.value())
    finally:
        consumer.close()
    history.check()  # at the offsets acknowledged, each value once, in order


def test_kcat_is_installed(kcat: str) -> None:
    result = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "kcat" in result.stdout


# --- the broker fixture ------------------------------------------------------------------------

# A stand-in for `kafscale serve`: /readyz on the metrics port, two children, and on SIGTERM
# either a clean stop (mode "clean") or an exit that abandons its children (mode "orphans").
# Mode "port-race" first fails the way a lost port race does, then behaves like "clean".
STAND_IN = r"""
import http.server, os, signal, subprocess, sys
mode, marker = sys.argv[1], sys.argv[2]
if mode == "port-race" and not os.path.exists(marker):
    open(marker, "w").close()
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(3)
kids = [subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"]) for _ in "ab"]

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass

def stop(signum, frame):
    if mode != "orphans":
        for kid in kids:
            kid.terminate()
            kid.wait()
    os._exit(0)

signal.signal(signal.SIGTERM, stop)
port = int(os.environ["KAFSCALE_METRICS_PORT"])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def stand_in_factory(tmp_path: Path, mode: str) -> BrokerFactory:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    factory = BrokerFactory(tmp_path / "brokers", mode, etcd=_no_backend, s3=_no_backend)
    factory.argv = (sys.executable, str(script), mode, str(tmp_path / "marker"))
    return factory


def gone(pid: int) -> bool:
    proc = read_proc(pid)
    return proc is None or not proc.running


def _no_backend() -> NoReturn:
    raise AssertionError("the stand-in runs on embedded backends")


def test_a_clean_stop_leaves_nothing_to_report(tmp_path: Path) -> None:
    factory = stand_in_factory(tmp_path, "clean")
    broker = factory(ready=True)
    kids = broker.children()
    assert len(kids) == 2
    assert broker.env["KAFSCALE_SHARDS"] == "2"
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert broker.terminate(timeout=10) == 0
    assert factory.close() == []
    assert all(gone(pid) for pid in kids)


def test_processes_left_after_sigterm_are_reported_and_killed(tmp_path: Path) -> None:
    factory = stand_in_factory(tmp_path, "orphans")
    broker = factory(ready=True)
    kids = broker.children()
    assert len(kids) == 2
    problems = factory.close()
    assert len(problems) == 1
    assert "processes still alive after SIGTERM" in problems[0]
    assert all(str(pid) in problems[0] for pid in kids)
    assert all(gone(pid) for pid in kids)


def test_a_lost_port_race_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    factory = stand_in_factory(tmp_path, "port-race")
    broker = factory()
    first_ports = (broker.port, broker.metrics_port)
    broker.wait_ready(timeout=20)
    assert (broker.port, broker.metrics_port) != first_ports
    assert broker.log_text().count("=== harness: starting") == 2
    assert broker.terminate(timeout=10) == 0
    assert factory.close() == []


def test_kafscale_serve_on_real_backends(
    start_broker: BrokerFactory, s3_server: MinioServer
) -> None:
    broker = start_broker(backends="real", ready=True)
    assert broker.env["KAFSCALE_S3_ENDPOINT"] == s3_server.endpoint_url
    s3_server.client().head_bucket(Bucket=broker.env["KAFSCALE_S3_BUCKET"])
    assert len(broker.children()) >= 3  # frontend, coordinator, flusher, shards
    assert broker.terminate(timeout=60) == 0
