"""Fixtures that run real servers and real clients (see tests/harness/).

Session scope, one set per pytest-xdist worker: `etcd_server`, `s3_server` (MinIO), `kube` (a
Kubernetes API server and garbage collector, no nodes), `java_probe`,
`kafka_tools` (Kafka's admin tools), `kcat`. Function scope: `s3_bucket` (a fresh bucket),
`start_broker` (alias `broker`), a factory that starts `kafscale serve` as real processes and
checks at teardown that SIGTERM stopped all of them, and `group_consumers`, a factory of
consumer-group members (any client) whose leftovers are killed at teardown, and `java_load`, a
factory of Java producers as a load for the fault tests.
The browser fixtures, `chromium` (session) and `browser_page` (function), are the plugin
tests/harness/browser.py.
Nothing is skipped when a tool is missing: the fixture fails and says to run
scripts/install-deps.sh.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.compat.matrix import tag
from tests.harness.broker import BrokerFactory, unique_bucket_name
from tests.harness.clients import JavaProbe, find_java, find_kcat
from tests.harness.etcd import EtcdServer
from tests.harness.groups import GroupConsumers
from tests.harness.java_load import JavaLoads
from tests.harness.kafka_tools import KafkaTools
from tests.harness.kube import KubeControlPlane
from tests.harness.minio import MinioServer
from tests.harness.procs import HarnessError

# One hypothesis database and Unicode charmap cache for this run and every process it starts:
# a Python subprocess that imports kio (which imports hypothesis when it can) in a directory of
# its own would otherwise rebuild the charmap, 4 s of CPU (kafscale.runtime).
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", str(Path(__file__).resolve().parent.parent / ".hypothesis")
)

T = TypeVar("T")

pytest_plugins = ("tests.harness.browser",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The compatibility matrix's cells each test proves, as `compat` user properties (JUnit
    XML carries them to tests/compat/report.py; see tests/compat/matrix.py)."""
    tag(items)


def _or_fail(make: Callable[[], T]) -> T:
    """Turn a harness failure into a plain test failure whose message is the whole story."""
    try:
        return make()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A real etcd on a free loopback port; `.stop()`/`.start()` keep its data and port."""
    server = _or_fail(lambda: EtcdServer(tmp_path_factory.mktemp("etcd")))
    _or_fail(server.start_first)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO on a free loopback port; objects persist across `.stop()`/`.start()`."""
    server = _or_fail(lambda: MinioServer(tmp_path_factory.mktemp("minio")))
    _or_fail(server.start_first)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeControlPlane]:
    """A real Kubernetes API server (with its own etcd) and the garbage collector: no nodes,
    so no pod ever runs (tests/harness/kube.py)."""
    plane = _or_fail(lambda: KubeControlPlane(tmp_path_factory.mktemp("kube")))
    try:
        _or_fail(plane.start)
        yield plane
    finally:
        plane.close()


@pytest.fixture
def s3_bucket(s3_server: MinioServer) -> str:
    """The name of a fresh, empty bucket on `s3_server`."""
    _or_fail(s3_server.ensure_running)
    return s3_server.create_bucket(unique_bucket_name())


@pytest.fixture
def start_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerFactory]:
    """`start_broker(env=None, backends="embedded"|"real", *, ready=False) -> BrokerProcess`.

    backends="real" starts (once per worker) etcd and MinIO and points the broker at them.
    The broker is returned once spawned: call `.wait_ready()` (or pass ready=True).
    At teardown every broker still running gets SIGTERM; the test fails if one does not exit 0
    in time, or if processes of a broker outlived its supervisor (unless the test `.kill()`ed
    it).
    """
    factory = BrokerFactory(
        tmp_path_factory.mktemp("brokers"),
        request.node.name,
        etcd=lambda: request.getfixturevalue("etcd_server"),
        s3=lambda: request.getfixturevalue("s3_server"),
    )
    yield factory
    problems = factory.close()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def broker(start_broker: BrokerFactory) -> BrokerFactory:
    """Another name for `start_broker` (the same factory within a test)."""
    return start_broker


@pytest.fixture(scope="session")
def java_probe() -> JavaProbe:
    """`java_probe("3.9" | "4", *args) -> CompletedProcess`; `.json(...)` parses stdout."""
    return _or_fail(lambda: JavaProbe(find_java()))


@pytest.fixture(scope="session")
def kafka_tools() -> KafkaTools:
    """`kafka_tools.run("consumer-groups" | "topics" | "configs", *args) -> CompletedProcess`;
    `.check(...)` returns stdout of a run that must succeed."""
    return _or_fail(lambda: KafkaTools(find_java()))


@pytest.fixture
def group_consumers(request: pytest.FixtureRequest) -> Iterator[GroupConsumers]:
    """`group_consumers.start(client, bootstrap, topics, group, **options) -> GroupConsumer`
    (see tests/harness/groups.py); members still running at teardown are killed."""
    factory = GroupConsumers(lambda: request.getfixturevalue("java_probe"))
    yield factory
    factory.close()


@pytest.fixture
def java_load(request: pytest.FixtureRequest) -> Iterator[JavaLoads]:
    """`java_load(bootstrap, topic, partitions, history, name) -> JavaLoad`, the Java probe's
    idempotent acks=all producer running until `.stop()`, its acknowledgements going into
    `history` (see tests/harness/java_load.py); loads still running at teardown are killed."""
    factory = JavaLoads(lambda: request.getfixturevalue("java_probe"))
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def kcat() -> str:
    """The path of the kcat binary."""
    return _or_fail(find_kcat)
