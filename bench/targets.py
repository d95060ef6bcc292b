"""The brokers a benchmark compares, started the same way every time on this machine.

- `kafscale`: `kafscale serve` on its embedded default (segments in a local directory, SQLite
  metadata), exactly as the README's first command runs it;
- `kafscale-s3`: `kafscale serve` against a real S3-compatible server (MinIO) and a real etcd,
  optionally behind a proxy that adds S3's latency to every PUT (and a little to every GET);
- `kafscale-s3x3`: the same with three brokers (ids 0-2) on one bucket and etcd namespace, the
  clients bootstrapped from all three (issue 16's scale-out; not in the default `--targets`);
- `kafka`: Apache Kafka, a single KRaft node from bench/install.sh's jars.

With `security` (bench/security.py's `SaslSsl`), each target also has a SASL_SSL listener with
SCRAM-SHA-512 and one user, and `bootstrap`, `client_config()` (confluent-kafka) and
`java_config_file()` (Kafka's tools) are that listener's: every client of the run goes through it.

Each target starts fresh (empty data), can restart on its data (for cold reads), names the
processes whose CPU and memory count as "the broker" (`broker_pids`) and, apart from them, the
storage servers KafScale uses in place of a disk (`backend_pids`). KafScale runs with its
defaults; only ports, directories and backends are set.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

from bench.kafka_server import KafkaServer, kafka_version
from bench.security import LABELS, LISTENER, PLAINTEXT, SaslSsl, tls_session
from kafscale.config import Config
from kafscale.config import load as load_config
from tests.harness.broker import STOP_TIMEOUT, BrokerFactory, BrokerProcess
from tests.harness.etcd import EtcdServer
from tests.harness.minio import MinioServer
from tests.harness.procs import free_port

TARGETS = ("kafscale", "kafscale-s3", "kafka")
# Targets a run takes only when named: three brokers on this machine's two cores.
SCALE_OUT_TARGETS = ("kafscale-s3x3",)
KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS = 3000  # group.initial.rebalance.delay.ms's default
T = TypeVar("T")
_BUFFER_BYTES = re.compile(r'^kafscale_buffer_bytes\{shard="\w+"\} (\S+)$', re.MULTILINE)
_S3_REQUEST = re.compile(r'^kafscale_s3_requests_total\{operation="(\w+)"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class S3Latency:
    """Seconds the proxy (tests/harness/s3_proxy.py) adds to each request before it reaches
    the S3 server: uniform in [put_min, put_max] for PUT (and POST, e.g. DeleteObjects), `get`
    for everything else."""

    put_min: float
    put_max: float
    get: float

    def describe(self) -> str:
        return (
            f"PUT +{self.put_min * 1000:.0f}-{self.put_max * 1000:.0f} ms, "
            f"other requests +{self.get * 1000:.0f} ms"
        )

    @classmethod
    def parse(cls, put_ms: str, get_ms: float) -> S3Latency | None:
        """From the command line: PUT latency 'MIN-MAX' or 'MS' ms ('0' or '' for no proxy)."""
        if put_ms in ("0", ""):
            return None
        low, _, high = put_ms.partition("-")
        return cls(float(low) / 1000, float(high or low) / 1000, get_ms / 1000)


class Target:
    name = "target"

    def __init__(self, work_dir: Path, security: SaslSsl | None = None) -> None:
        self.work_dir = work_dir
        self.security = security

    @property
    def bootstrap(self) -> str:
        """The clients' bootstrap: the SASL_SSL listener's with `security`."""
        raise NotImplementedError

    @property
    def security_label(self) -> str:
        """How the clients connect: "PLAINTEXT" or "SASL_SSL"."""
        return self.security.label if self.security is not None else LABELS[PLAINTEXT]

    def client_config(self) -> dict[str, str]:
        """confluent-kafka settings every client of the run adds (none for PLAINTEXT)."""
        return self.security.librdkafka() if self.security is not None else {}

    def java_config_file(self) -> Path | None:
        """A properties file of the Java clients' settings, for Kafka's tools' --command-config
        (None for PLAINTEXT)."""
        return self.security.java_properties if self.security is not None else None

    def describe_security(self) -> str:
        """How this target serves SASL_SSL (for the report)."""
        raise NotImplementedError

    def tls_session(self) -> str | None:
        """What an OpenSSL client negotiates with the first SASL_SSL listener (None without)."""
        if self.security is None:
            return None
        return tls_session(self.bootstrap.split(",")[0], self.security.ca_file)

    def start(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Stop and start again on the same data (for reads that must come from storage)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def broker_pids(self) -> list[int]:
        raise NotImplementedError

    def backend_pids(self) -> list[int]:
        return []

    def s3_requests(self) -> Counter[str]:
        """Object-store requests so far by operation (put, get, head, list, delete)."""
        return Counter()

    def metrics_text(self) -> str:
        """The broker's Prometheus /metrics page ("" for a broker without one here)."""
        return ""

    def config(self) -> Config | None:
        """The broker's KafScale configuration (None for Kafka)."""
        return None

    def stored_bytes(self) -> int | None:
        """Bytes in the object store now, everything in it (None: the broker keeps a log on
        disk instead)."""
        return None

    def settle(self) -> None:
        """Wait until work the clients already saw acknowledged is done (KafScale flushes
        acks=1 data after the ack), so that it is charged to the measurement that caused it."""

    def describe(self) -> str:
        raise NotImplementedError


class KafScaleTarget(Target):
    """One `kafscale serve`, or with `brokers` > 1 (S3 only) that many on one bucket and etcd
    namespace, ids 0..n-1: the clients bootstrap from all of them, and the broker's figures
    (processes, S3 requests, unflushed bytes) are every broker's summed."""

    def __init__(
        self,
        work_dir: Path,
        *,
        s3: bool,
        latency: S3Latency | None = None,
        env: dict[str, str] | None = None,
        brokers: int = 1,
        security: SaslSsl | None = None,
    ) -> None:
        super().__init__(work_dir, security)
        if brokers > 1 and not s3:
            raise ValueError("several brokers need etcd and an object store (s3=True)")
        self.name = "kafscale" if not s3 else "kafscale-s3" + (f"x{brokers}" if brokers > 1 else "")
        self.s3 = s3
        self.latency = latency
        self.env = dict(env or {})  # KAFSCALE_* settings the run sets (--broker-env)
        self.count = brokers
        self._etcd: EtcdServer | None = None
        self._minio: MinioServer | None = None
        # The latency proxy runs as a process of its own: in the benchmark's process its
        # threads would compete for the GIL with the Python client being measured.
        self._proxy: subprocess.Popen[str] | None = None
        self._proxy_url = ""
        self._factory: BrokerFactory | None = None
        self.brokers: list[BrokerProcess] = []
        self._base_requests: Counter[str] = Counter()

    @property
    def broker(self) -> BrokerProcess:
        """The first broker (the only one unless `brokers` > 1)."""
        if not self.brokers:
            raise RuntimeError(f"{self.name} is not running")
        return self.brokers[0]

    @property
    def bootstrap(self) -> str:
        if not self.brokers:
            raise RuntimeError(f"{self.name} is not running")
        if self.security is not None:
            return ",".join(_secure_bootstrap(broker) for broker in self.brokers)
        return ",".join(broker.bootstrap for broker in self.brokers)

    def start(self) -> None:
        overrides: dict[str, str] = dict(self.env)
        if self.s3:
            self._etcd = EtcdServer(self.work_dir / "etcd")
            self._minio = MinioServer(self.work_dir / "minio")
            self._etcd.start_first()
            self._minio.start_first()
            if self.latency is not None:
                self._proxy = _start_proxy(self._minio.endpoint_url, self.latency)
                assert self._proxy.stdout is not None
                self._proxy_url = self._proxy.stdout.readline().strip()
                if not self._proxy_url.startswith("http://"):
                    raise RuntimeError(f"the S3 latency proxy did not start: {self._proxy_url!r}")
                overrides["KAFSCALE_S3_ENDPOINT"] = self._proxy_url
        etcd, minio = self._etcd, self._minio
        self._factory = BrokerFactory(
            self.work_dir / "brokers",
            "bench",
            etcd=lambda: _required(etcd),
            s3=lambda: _required(minio),
        )
        envs = (
            [overrides]
            if self.count == 1
            else [{**overrides, "KAFSCALE_BROKER_ID": str(i)} for i in range(self.count)]
        )
        if self.security is not None:
            # Each broker its own ports (the env is kept: a restart reuses them).
            envs = [{**env, **self.security.kafscale_env(free_port(), free_port())} for env in envs]
        self.brokers = self._spawn(envs)

    def _spawn(self, envs: list[dict[str, str]]) -> list[BrokerProcess]:
        """A broker per `env`, spawned together (each boots while the others do), then each
        waited for until ready."""
        assert self._factory is not None
        started = [self._factory(dict(env), "real" if self.s3 else "embedded") for env in envs]
        for broker in started:
            broker.wait_ready()
        return started

    def start_broker(self, env: dict[str, str]) -> BrokerProcess:
        """Another broker on this target's backends (`env`: a stopped one's, to restart it on
        its id and ports); ready when returned. The caller keeps `brokers` up to date."""
        if self._factory is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._spawn([env])[0]

    def restart(self) -> None:
        assert self._factory is not None
        self._base_requests = self.s3_requests()
        # One at a time: each hands its partitions to those still running, the last to none.
        for old in self.brokers:
            code = old.terminate(timeout=STOP_TIMEOUT)
            if code != 0:
                raise RuntimeError(f"{self.name} exited {code} on SIGTERM\n{old.log_tail()}")
        self.brokers = self._spawn([old.env for old in self.brokers])

    def stop(self) -> None:
        problems = self._factory.close() if self._factory is not None else []
        if self._proxy is not None:
            self._proxy.terminate()
            self._proxy.wait(10)
        for server in (self._minio, self._etcd):
            if server is not None:
                server.close()
        self.brokers = []
        if problems:
            raise RuntimeError(f"{self.name} did not stop cleanly:\n" + "\n".join(problems))

    def broker_pids(self) -> list[int]:
        return [broker.pid for broker in self.brokers if broker.running]

    def backend_pids(self) -> list[int]:
        pids = [pid for s in (self._minio, self._etcd) if s is not None and (pid := s.pid)]
        return pids + ([self._proxy.pid] if self._proxy is not None else [])

    def metrics_text(self) -> str:
        """The one broker's page; several brokers' pages do not add up to one (their series
        would repeat), so scenarios that read it do not run on a cluster."""
        if self.count > 1:
            raise RuntimeError(f"{self.name}: {self.count} brokers have no single /metrics page")
        return self.broker.metrics_text()

    def config(self) -> Config:
        return load_config(self.broker.env)

    def stored_bytes(self) -> int:
        """The sizes of every object: MinIO's bucket listed directly (not through the latency
        proxy, and not counted as the broker's requests), or the local store's files."""
        if self._minio is None:
            return _dir_bytes(Path(self.broker.env["KAFSCALE_DATA_DIR"]) / "segments")
        client = self._minio.client()
        total = 0
        pages = client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.broker.env["KAFSCALE_S3_BUCKET"]):
            total += sum(item["Size"] for item in page.get("Contents", []))
        return total

    def s3_requests(self) -> Counter[str]:
        """Counts from every running broker's /metrics, kept across restarts (a restarted
        broker's counters start again at zero)."""
        now: Counter[str] = Counter()
        for broker in self.brokers:
            if broker.running:
                now.update(_s3_counts(broker.metrics_text()))
        return now + self._base_requests

    def settle(self, timeout: float = 60.0) -> None:
        """Until no shard of any broker holds unflushed bytes (kafscale_buffer_bytes sums to 0)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            held = sum(
                float(n)
                for broker in self.brokers
                if broker.running
                for n in _BUFFER_BYTES.findall(broker.metrics_text())
            )
            if held == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} still holds unflushed bytes after {timeout} s")

    def describe_security(self) -> str:
        return (
            "a second listener, SASL_SSL (KAFSCALE_LISTENERS, KAFSCALE_SSL_CERT_FILE/_KEY_FILE; "
            "the user is the first admin, KAFSCALE_SASL_ADMIN_USER), beside PLAINTEXT; the "
            "clients use the SASL_SSL one"
        )

    def describe(self) -> str:
        if not self.s3:
            return f"KafScale {version('kafscale')}, embedded default (local directory + SQLite)"
        latency = f"; S3 latency added: {self.latency.describe()}" if self.latency else ""
        brokers = (
            f", {self.count} brokers (ids 0-{self.count - 1}) on one bucket and etcd namespace"
            if self.count > 1
            else ""
        )
        return f"KafScale {version('kafscale')}, MinIO + etcd{brokers}{latency}"


class KafkaTarget(Target):
    name = "kafka"

    def __init__(self, work_dir: Path, security: SaslSsl | None = None) -> None:
        super().__init__(work_dir, security)
        # Kafka's defaults, as KafScale runs with its own (both wait 3 s for a new group's
        # first members before its first rebalance).
        self.server = KafkaServer(
            work_dir,
            port=free_port(),
            controller_port=free_port(),
            group_initial_rebalance_delay_ms=KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS,
            sasl_ssl=security,
            sasl_ssl_port=free_port() if security is not None else None,
        )

    @property
    def bootstrap(self) -> str:
        return self.server.client_bootstrap

    def start(self) -> None:
        self.server.start()

    def restart(self) -> None:
        self.server.stop()
        self.server.start(fresh=False)

    def stop(self) -> None:
        self.server.stop()

    def broker_pids(self) -> list[int]:
        return [self.server.pid]

    def describe_security(self) -> str:
        return (
            "a SASL_SSL listener (PEM keystore: ssl.keystore.type=PEM, key and chain in one file; "
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config; the user created by "
            "kafka-storage format --add-scram), beside the PLAINTEXT (inter-broker) and "
            "CONTROLLER listeners; the clients use the SASL_SSL one"
        )

    def describe(self) -> str:
        return f"Apache Kafka {kafka_version()}, one KRaft node (broker + controller), 1 GiB heap"


def _secure_bootstrap(broker: BrokerProcess) -> str:
    """host:port of a KafScale broker's SASL_SSL listener (bench/security.py names it)."""
    for listener in broker.env["KAFSCALE_LISTENERS"].split(","):
        name, _, address = listener.partition("://")
        if name == LISTENER:
            return address
    raise RuntimeError(f"no {LISTENER} listener in {broker.env['KAFSCALE_LISTENERS']}")


def _start_proxy(upstream: str, latency: S3Latency) -> subprocess.Popen[str]:
    """tests.harness.s3_proxy in a process of its own; its first line is its endpoint."""
    argv = [
        sys.executable, "-m", "tests.harness.s3_proxy", upstream,
        "--put-ms", f"{latency.put_min * 1000:g}-{latency.put_max * 1000:g}",
        "--other-ms", f"{latency.get * 1000:g}",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout is not None
    return proc


def _s3_counts(metrics: str) -> Counter[str]:
    return Counter({op: int(float(n)) for op, n in _S3_REQUEST.findall(metrics)})


def _dir_bytes(root: Path) -> int:
    """The sizes of the files under `root`; a file deleted while it is walked counts 0."""
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _required(server: T | None) -> T:
    if server is None:
        raise RuntimeError("the embedded target has no S3 or etcd server")
    return server


def make_target(
    name: str,
    work_dir: Path,
    latency: S3Latency | None,
    env: dict[str, str] | None = None,
    security: SaslSsl | None = None,
) -> Target:
    """A target; ``env`` sets KAFSCALE_* variables of the KafScale targets (Kafka ignores it);
    with ``security`` the clients connect over SASL_SSL."""
    if name == "kafscale":
        return KafScaleTarget(work_dir, s3=False, env=env, security=security)
    if name == "kafscale-s3":
        return KafScaleTarget(work_dir, s3=True, latency=latency, env=env, security=security)
    if name == "kafscale-s3x3":
        return KafScaleTarget(
            work_dir, s3=True, latency=latency, env=env, brokers=3, security=security
        )
    if name == "kafka":
        return KafkaTarget(work_dir, security)
    known = ", ".join(TARGETS + SCALE_OUT_TARGETS)
    raise ValueError(f"unknown target {name!r}; choose from {known}")
