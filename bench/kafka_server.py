"""A single-node Apache Kafka (KRaft, broker and controller in one JVM) for benchmarks that compare
KafScale with it on the same machine.

It runs from the jars bench/install.sh copies into bench/java/target/lib (see bench/java/pom.xml),
the way a Kafka distribution's kafka-server-start.sh runs them: `java -cp 'lib/*' kafka.Kafka
server.properties`, with that script's JVM options (1 GiB heap, G1). The configuration is Kafka's
defaults except what a single node needs (replication factor 1 for the internal topics, one
partition per auto-created topic, no initial rebalance delay); in particular the log is not
fsynced per message (log.flush.interval.messages stays at its Long.MAX_VALUE default), as in
production. Everything it writes (configuration, data, logs) stays under the work directory.

    with KafkaServer(work_dir, port=free_port(), controller_port=free_port()) as kafka:
        ...  # kafka.bootstrap, kafka.pid
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bench.security import SaslSsl

BENCH_JAVA = Path(__file__).resolve().parent / "java"
KAFKA_LIB = BENCH_JAVA / "target" / "lib"
SERVER_LOG4J2 = BENCH_JAVA / "log4j2-server.properties"
TOOLS_LOG4J2 = BENCH_JAVA / "log4j2-tools.properties"
LOOPBACK = "127.0.0.1"

# kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS.
SERVER_HEAP = ["-Xmx1G", "-Xms1G"]
JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]

# Main classes of Kafka 4.x (bin/kafka-server-start.sh, bin/kafka-storage.sh).
SERVER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"


class KafkaServerError(RuntimeError):
    """Kafka did not format, start or stop; the message carries the tail of its log."""


def free_port() -> int:
    """A loopback TCP port the kernel reports free now (another process may still take it before
    Kafka binds it; a start that loses that race fails with "Address already in use")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def java_command() -> str:
    """The java executable: $JAVA_HOME/bin/java when set, else the one on PATH."""
    if home := os.environ.get("JAVA_HOME"):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaServerError("java is not on PATH (and JAVA_HOME is not set)")
    return java


def java_argv(
    main: str,
    *args: str,
    heap: Sequence[str],
    log4j2: Path,
    lib: Path,
    jvm_options: Sequence[str] = (),
) -> list[str]:
    """The command line of one of Kafka's main classes, as bin/kafka-run-class.sh builds it."""
    return [
        java_command(),
        *heap,
        *JVM_PERFORMANCE_OPTS,
        *jvm_options,
        f"-Dlog4j2.configurationFile={log4j2}",
        "-cp",
        f"{lib}/*",
        main,
        *args,
    ]


def cluster_id() -> str:
    """A random cluster id in Kafka's form, a UUID in unpadded base64url; like Kafka's
    Uuid.randomUuid, never one starting with "-", which the storage tool would read as an option."""
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded


def require_jars(lib: Path = KAFKA_LIB) -> None:
    """Fail with the fix when bench/install.sh has not copied Kafka's jars."""
    for pattern in ("kafka_2.13-*.jar", "kafka-tools-[0-9]*.jar", "log4j-slf4j-impl-*.jar"):
        if not any(lib.glob(pattern)):
            raise KafkaServerError(f"no {pattern} in {lib}: run bench/install.sh")


def kafka_version(lib: Path = KAFKA_LIB) -> str:
    """The Kafka release of the jars, from the kafka_2.13 jar's name."""
    [jar] = lib.glob("kafka_2.13-*.jar")
    return jar.stem.removeprefix("kafka_2.13-")


class KafkaServer:
    """One KRaft node on 127.0.0.1: `start()` formats a fresh log directory and waits until the
    broker answers a Metadata request; `stop()` sends SIGTERM (a controlled shutdown) and SIGKILLs
    a JVM that outlives the timeout. Usable as a context manager.

    `overrides` replaces or adds server.properties entries (e.g. num.io.threads).

    With `sasl_ssl` (and `sasl_ssl_port`) it also has a SASL_SSL listener there with SCRAM-SHA-512
    (bench/security.py): the user is created when the log directory is formatted, and
    `client_bootstrap` and `client_config` are that listener's; PLAINTEXT stays the inter-broker
    listener."""

    def __init__(
        self,
        work_dir: Path,
        *,
        port: int,
        controller_port: int,
        group_initial_rebalance_delay_ms: int = 0,
        overrides: Mapping[str, str] | None = None,
        lib: Path = KAFKA_LIB,
        sasl_ssl: SaslSsl | None = None,
        sasl_ssl_port: int | None = None,
    ) -> None:
        if (sasl_ssl is None) != (sasl_ssl_port is None):
            raise ValueError("sasl_ssl and sasl_ssl_port go together")
        self.work_dir = work_dir
        self.port = port
        self.sasl_ssl = sasl_ssl
        self.sasl_ssl_port = sasl_ssl_port
        self.controller_port = controller_port
        self.group_initial_rebalance_delay_ms = group_initial_rebalance_delay_ms
        self.overrides = dict(overrides or {})
        self.lib = lib
        self.config_path = work_dir / "server.properties"
        self.data_dir = work_dir / "data"
        self.log_dir = work_dir / "logs"
        self.console_log = self.log_dir / "console.log"
        # Seconds from launching the JVM to the first answered Metadata request (format excluded).
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """host:port of the PLAINTEXT listener, for bootstrap.servers."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def client_bootstrap(self) -> str:
        """host:port the clients use: the SASL_SSL listener's when there is one."""
        if self.sasl_ssl_port is not None:
            return f"{LOOPBACK}:{self.sasl_ssl_port}"
        return self.bootstrap

    def client_config(self) -> dict[str, str]:
        """confluent-kafka settings for `client_bootstrap` (none for PLAINTEXT)."""
        return self.sasl_ssl.librdkafka() if self.sasl_ssl is not None else {}

    @property
    def pid(self) -> int:
        """The JVM's pid (the java process itself: no wrapper script in between), for reading
        its CPU time and RSS from /proc."""
        if self._proc is None:
            raise KafkaServerError("Kafka is not running")
        return self._proc.pid

    def properties(self) -> dict[str, str]:
        """server.properties: a combined broker and controller whose dynamic quorum is itself
        (controller.quorum.bootstrap.servers, formatted with --standalone, as Kafka 4.x's
        config/server.properties is)."""
        controller = f"{LOOPBACK}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://{controller}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": controller,
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": str(self.group_initial_rebalance_delay_ms),
        }
        if self.sasl_ssl is not None:
            secure = f"SASL_SSL://{self.client_bootstrap}"
            props["listeners"] += f",{secure}"
            props["advertised.listeners"] += f",{secure}"
            props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
            props.update(self.sasl_ssl.kafka_properties())
        props.update(self.overrides)
        return props

    def start(self, timeout: float = 60.0, *, fresh: bool = True) -> None:
        """Write server.properties, format a fresh log directory (an earlier run's data and logs
        are wiped) and start the broker; return once a Metadata request succeeds. With
        `fresh=False` it restarts on the data an earlier `start()` left (a restart)."""
        require_jars(self.lib)
        if self._proc is not None:
            raise KafkaServerError("Kafka is already running")
        if fresh:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir.mkdir(parents=True)
            lines = [f"{key}={value}" for key, value in self.properties().items()]
            self.config_path.write_text("\n".join(lines) + "\n")
            self._format()
        argv = java_argv(
            SERVER_MAIN,
            str(self.config_path),
            heap=SERVER_HEAP,
            log4j2=SERVER_LOG4J2,
            lib=self.lib,
            jvm_options=[f"-Dkafka.logs.dir={self.log_dir}"],
        )
        started = time.monotonic()
        with self.console_log.open("ab") as console:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for the benchmark must not reach it
            )
        try:
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for the controlled shutdown; SIGKILL after `timeout`. Returns the
        JVM's exit status: 143 after a SIGTERM whose shutdown hooks finished (Kafka's normal
        way out), -9 after the kill."""
        proc, self._proc = self._proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    def __enter__(self) -> KafkaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _format(self) -> None:
        argv = java_argv(
            STORAGE_TOOL_MAIN,
            "format",
            "--cluster-id",
            cluster_id(),
            "--config",
            str(self.config_path),
            "--standalone",
            *(self.sasl_ssl.kafka_format_args() if self.sasl_ssl is not None else []),
            heap=[],
            log4j2=TOOLS_LOG4J2,
            lib=self.lib,
        )
        result = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise KafkaServerError(
                f"kafka-storage format exited {result.returncode}\n"
                f"{result.stdout}\n{result.stderr[-4000:]}"
            )

    def _wait_ready(self, deadline: float) -> None:
        admin = AdminClient(
            {"bootstrap.servers": self.client_bootstrap, "log_level": 0, **self.client_config()}
        )
        while True:
            assert self._proc is not None
            if (code := self._proc.poll()) is not None:
                raise KafkaServerError(f"Kafka exited {code} while starting\n{self._log_tail()}")
            try:
                if admin.list_topics(timeout=1.0).brokers:
                    return
            except KafkaException:
                pass  # not listening yet: librdkafka reports the timeout as an exception
            if time.monotonic() >= deadline:
                raise KafkaServerError(
                    f"Kafka did not answer on {self.client_bootstrap}\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _log_tail(self) -> str:
        """What explains a failed start: the first ERROR in server.log with the exception line
        under it (what follows is mostly the shutdown it set off), and the JVM's console output."""
        server_log = self.log_dir / "server.log"
        try:
            lines = server_log.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        first_error = next((i for i, line in enumerate(lines) if "] ERROR " in line), None)
        cause = "\n".join(lines[first_error : first_error + 2]) if first_error is not None else ""
        try:
            console = "\n".join(self.console_log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            console = ""
        return (
            f"--- first error in {server_log} ---\n{cause or '(none)'}\n"
            f"--- last lines of {self.console_log} ---\n{console or '(empty)'}"
        )
