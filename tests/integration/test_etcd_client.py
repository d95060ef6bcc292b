"""The etcd client against real etcd: failover in a 3-member cluster, TLS with client
certificates, and authentication (``kafscale.metadata.etcd``, ``etcd_channel``, ``etcd_watch``).

Failover: the store uses one member; when that member stops, the call that finds it gone raises
``MetadataStoreUnavailable`` and the calls after it go to another member of the same cluster --
puts, gets, transactions, leases and the watch carry on, and the watch sees every change exactly
once, in revision order. A write is retried as put-if-absent, so one that was applied before its
answer was lost is not made twice. TLS and authentication: every kind of call works, and a wrong
CA, a missing client certificate, wrong or missing credentials fail with an error naming the
cause and the settings to look at.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale import config as configuration
from kafscale.metadata import (
    Compare,
    Delete,
    EventType,
    MetadataStore,
    MetadataStoreError,
    MetadataStoreUnavailable,
    Put,
    open_metadata_store,
)
from kafscale.metadata.etcd import PAGE_KEYS, EtcdMetadataStore, EtcdSecurity
from tests.harness.etcd import EtcdCluster, EtcdServer, EtcdTls, enable_auth
from tests.harness.procs import HarnessError
from tests.harness.tls import Pki, make_pki
from tests.unit.metadata.test_metadata_store_contract import Collector, wait_until

pytestmark = pytest.mark.integration

PASSWORD = "kafscale-test-password"
TOKEN_TTL_S = 1  # etcd's --auth-token-ttl: an idle token expires within ~2 s


def _started(server: EtcdServer | EtcdCluster) -> None:
    try:
        server.start_first()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd-cluster"), size=3)
    _started(etcd)
    try:
        yield etcd
    finally:
        etcd.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EtcdServer]:
    tls = EtcdTls(
        pki.ca_file, pki.server_cert, pki.server_key, True, pki.client_cert, pki.client_key
    )
    server = EtcdServer(tmp_path_factory.mktemp("etcd-tls"), tls=tls)
    _started(server)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(
        tmp_path_factory.mktemp("etcd-auth"), extra_args=[f"--auth-token-ttl={TOKEN_TTL_S}"]
    )
    _started(server)
    try:
        enable_auth(server, PASSWORD)
        yield server
    finally:
        server.close()


def _prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}/"


def _exercise(store: MetadataStore, prefix: str = "") -> None:
    """Put, get, a transaction, a lease and a watch that sees all of them."""
    prefix += _prefix()
    seen = Collector()
    watch = store.watch_prefix(prefix, seen)
    revision = store.put(prefix + "a", b"1")
    kv = store.get(prefix + "a")
    assert kv is not None and (kv.value, kv.mod_revision) == (b"1", revision)
    result = store.transaction(
        [Compare(prefix + "a", mod_revision=revision)], [Put(prefix + "b", b"2")]
    )
    assert result.succeeded
    lease = store.grant_lease(5)
    store.put(prefix + "leased", b"3", lease_id=lease.id)
    lease.refresh()
    lease.revoke()
    assert [kv.key for kv in store.get_prefix(prefix)] == [prefix + "a", prefix + "b"]
    seen.wait_for(4)
    assert seen.seen() == [
        (EventType.PUT, prefix + "a", b"1"),
        (EventType.PUT, prefix + "b", b"2"),
        (EventType.PUT, prefix + "leased", b"3"),
        (EventType.DELETE, prefix + "leased", b""),
    ]
    watch.cancel()


def _put_new(store: MetadataStore, key: str, deadline_s: float = 20.0) -> int:
    """Create ``key`` (put-if-absent) through failovers; how many attempts found etcd gone."""
    failures, deadline = 0, time.monotonic() + deadline_s
    while True:
        try:
            store.transaction([Compare.absent(key)], [Put(key, key.encode())])
            return failures
        except MetadataStoreUnavailable:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _assert_watched_once_in_order(seen: Collector, keys: list[str]) -> None:
    events = seen.wait_for(len(keys))
    assert [e.key for e in events] == keys
    revisions = [e.mod_revision for e in events]
    assert revisions == sorted(set(revisions))


# -- failover -----------------------------------------------------------------------------------


def test_stopping_the_member_in_use_moves_the_next_call_to_another(cluster: EtcdCluster) -> None:
    first, second = cluster.members[0], cluster.members[1]
    cluster.move_leader(second)  # `first` is a follower: the others keep a leader
    store = EtcdMetadataStore(cluster.endpoints, timeout=2.0)
    prefix = _prefix()
    seen = Collector()
    try:
        assert store.description == f"etcd://{first.endpoint}"
        watch = store.watch_prefix(prefix, seen)
        lease = store.grant_lease(30)
        store.put(prefix + "owner", b"held", lease_id=lease.id)
        first.stop()
        try:
            kv = store.get(prefix + "owner")  # unless the watch found `first` gone already
        except MetadataStoreUnavailable as exc:
            assert first.endpoint in str(exc)
            kv = store.get(prefix + "owner")  # the very next call: no waiting, no outage
        assert store.description == f"etcd://{second.endpoint}"
        assert kv is not None and (kv.value, kv.lease_id) == (b"held", lease.id)
        revision = store.put(prefix + "after", b"1")
        assert store.transaction(
            [Compare(prefix + "after", mod_revision=revision)], [Put(prefix + "txn", b"2")]
        ).succeeded
        lease.refresh()
        _assert_watched_once_in_order(seen, [prefix + k for k in ("owner", "after", "txn")])
        wait_until(lambda: watch.last_error is None, "the watch to resume on another member")
    finally:
        store.close()
        first.ensure_running()


def test_losing_the_leader_in_use_loses_no_write_and_no_watch_event(cluster: EtcdCluster) -> None:
    """The member in use is the leader and crashes (SIGKILL: it hands over nothing): calls fail
    while the others elect a new leader, then every write lands once and the watch misses none."""
    for member in cluster.members:
        member.ensure_running()
    leader = cluster.members[2]
    cluster.move_leader(leader)
    endpoints = [leader.endpoint, *(m.endpoint for m in cluster.members[:2])]
    store = EtcdMetadataStore(endpoints, timeout=2.0)
    prefix = _prefix()
    seen = Collector()
    keys = [f"{prefix}{index:03d}" for index in range(40)]
    try:
        watch = store.watch_prefix(prefix, seen)
        lease = store.grant_lease(30)
        for key in keys[:10]:
            assert _put_new(store, key) == 0
        leader.kill()
        for key in keys[10:]:
            _put_new(store, key)
        assert store.description != f"etcd://{leader.endpoint}"
        lease.refresh()
        assert [kv.key for kv in store.get_prefix(prefix)] == keys
        _assert_watched_once_in_order(seen, keys)
        wait_until(lambda: watch.last_error is None, "the watch to resume on another member")
    finally:
        store.close()
        leader.ensure_running()


def test_etcd_is_down_only_once_every_endpoint_failed_in_a_row(cluster: EtcdCluster) -> None:
    """The outage gate (calls refused at once) opens when the last endpoint fails too, not at
    the first failure, and closes again once the probe finds a member that answers."""
    member = cluster.members[1]
    member.ensure_running()
    closed = f"127.0.0.1:{_closed_port()}"
    store = EtcdMetadataStore([member.endpoint, closed], timeout=2.0)
    try:
        member.stop()
        with pytest.raises(MetadataStoreUnavailable, match=f"{member.endpoint} is unreachable"):
            store.get("k")
        with pytest.raises(MetadataStoreUnavailable, match=f"{closed} is unreachable") as second:
            store.get("k")
        assert "refusing calls" not in str(second.value)  # sent: the gate was still closed
        with pytest.raises(MetadataStoreUnavailable, match="refusing calls until it answers"):
            store.get("k")
        member.start()

        def answers() -> bool:
            try:
                store.get("k")
            except MetadataStoreUnavailable:
                return False
            return True

        wait_until(answers, "the probe to find the member back")
        assert store.description == f"etcd://{member.endpoint}"
    finally:
        store.close()
        member.ensure_running()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_prefix_larger_than_one_grpc_message_is_read_whole(cluster: EtcdCluster) -> None:
    store = EtcdMetadataStore(cluster.endpoints, timeout=30.0)
    prefix = _prefix()
    value = b"x" * (1024 * 1024)  # etcd takes requests up to 1.5 MiB
    keys = [f"{prefix}{i:03d}" for i in range(66)]  # 66 MiB of values
    try:
        for key in keys:
            store.put(key, value)
        # Found by scripts/chaos.sh (tests/chaos/results/2026-11-27-1624.md): read as one Range,
        # this failed with RESOURCE_EXHAUSTED, and so did every boot of the namespace.
        assert [kv.key for kv in store.get_prefix(prefix)] == keys
    finally:
        for key in keys:
            store.delete(key)
        store.close()


def test_a_prefix_of_several_pages_is_read_whole_in_order(cluster: EtcdCluster) -> None:
    store = EtcdMetadataStore(cluster.endpoints, timeout=30.0)
    prefix = _prefix()
    keys = [f"{prefix}{i:05d}" for i in range(2 * PAGE_KEYS + 7)]
    try:
        for start in range(0, len(keys), 100):
            store.transaction([], [Put(key, key.encode()) for key in keys[start : start + 100]])
        found = store.get_prefix(prefix)
        assert [(kv.key, kv.value) for kv in found] == [(key, key.encode()) for key in keys]
    finally:
        for start in range(0, len(keys), 100):
            store.transaction([], [Delete(key) for key in keys[start : start + 100]])
        store.close()


# -- TLS ----------------------------------------------------------------------------------------


def _tls(pki: Pki, ca_file: Path | None = None, client: bool = True) -> EtcdSecurity:
    return EtcdSecurity(
        ca_file=str(ca_file or pki.ca_file),
        cert_file=str(pki.client_cert) if client else "",
        key=pki.client_key.read_text() if client else "",
    )


def test_tls_with_a_client_certificate_serves_every_call(tls_etcd: EtcdServer, pki: Pki) -> None:
    store = EtcdMetadataStore([f"https://{tls_etcd.endpoint}"], security=_tls(pki))
    try:
        _exercise(store)
    finally:
        store.close()


def test_tls_settings_from_the_environment_make_host_port_tls(
    tls_etcd: EtcdServer, pki: Pki
) -> None:
    config = configuration.load(
        {
            "KAFSCALE_ETCD_ENDPOINTS": tls_etcd.endpoint,  # no scheme: TLS, as the files are set
            "KAFSCALE_ETCD_CA_FILE": str(pki.ca_file),
            "KAFSCALE_ETCD_CERT_FILE": str(pki.client_cert),
            "KAFSCALE_ETCD_KEY_FILE": str(pki.client_key),
        }
    )
    store = open_metadata_store(config)
    try:
        _exercise(store)
    finally:
        store.close()


@pytest.mark.parametrize("trust", ["another CA", "the system's roots"])
def test_tls_against_an_untrusted_server_names_the_ca_setting(
    tls_etcd: EtcdServer, pki: Pki, trust: str
) -> None:
    security = _tls(pki, pki.other_ca_file) if trust == "another CA" else EtcdSecurity()
    with pytest.raises(
        MetadataStoreError, match=r"TLS connection failed.*KAFSCALE_ETCD_CA_FILE"
    ) as e:
        EtcdMetadataStore([f"https://{tls_etcd.endpoint}"], timeout=2.0, security=security)
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)


def test_tls_without_a_client_certificate_names_the_cert_setting(
    tls_etcd: EtcdServer, pki: Pki
) -> None:
    with pytest.raises(MetadataStoreError, match=r"TLS connection failed.*KAFSCALE_ETCD_CERT_FILE"):
        EtcdMetadataStore(
            [f"https://{tls_etcd.endpoint}"], timeout=2.0, security=_tls(pki, client=False)
        )


# -- authentication -----------------------------------------------------------------------------


def _auth(username: str = "root", password: str = PASSWORD) -> EtcdSecurity:
    return EtcdSecurity(username=username, password=password)


def test_authenticated_store_serves_every_call_and_renews_an_expired_token(
    auth_etcd: EtcdServer,
) -> None:
    store = EtcdMetadataStore([auth_etcd.endpoint], security=_auth())
    try:
        _exercise(store)
        key = _prefix() + "k"
        store.put(key, b"before")
        token = store._cluster.metadata
        time.sleep(TOKEN_TTL_S + 2)  # etcd drops an idle token once a second past its TTL
        assert store.get(key).value == b"before"  # type: ignore[union-attr]
        assert store._cluster.metadata != token  # refused for its token, authenticated again
    finally:
        store.close()


def test_authentication_settings_from_the_environment(
    auth_etcd: EtcdServer, tmp_path: Path
) -> None:
    password_file = tmp_path / "etcd-password"
    password_file.write_text(PASSWORD + "\n")
    config = configuration.load(
        {
            "KAFSCALE_ETCD_ENDPOINTS": f"http://{auth_etcd.endpoint}",
            "KAFSCALE_ETCD_USERNAME": "root",
            "KAFSCALE_ETCD_PASSWORD_FILE": str(password_file),
        }
    )
    store = open_metadata_store(config)
    try:
        _exercise(store)
    finally:
        store.close()


def test_a_user_with_the_documented_role_serves_every_call(auth_etcd: EtcdServer) -> None:
    """docs/operations.md: readwrite on /kafscale/, read on every key (for the revision)."""
    user = f"kafscale-{uuid.uuid4().hex[:8]}"
    root = ("--user", f"root:{PASSWORD}")
    auth_etcd.etcdctl(*root, "role", "add", user)
    auth_etcd.etcdctl(
        *root, "role", "grant-permission", user, "--prefix=true", "readwrite", "/kafscale/"
    )
    auth_etcd.etcdctl(*root, "role", "grant-permission", user, "--prefix=true", "read", "")
    auth_etcd.etcdctl(*root, "user", "add", f"{user}:{PASSWORD}")
    auth_etcd.etcdctl(*root, "user", "grant-role", user, user)
    store = EtcdMetadataStore([auth_etcd.endpoint], security=_auth(user))
    try:
        _exercise(store, "/kafscale/")
        with pytest.raises(MetadataStoreError, match="PERMISSION_DENIED"):
            store.put("elsewhere", b"")
    finally:
        store.close()


def test_a_wrong_password_is_refused_naming_the_settings(auth_etcd: EtcdServer) -> None:
    with pytest.raises(MetadataStoreError, match="refused the user name or password") as refused:
        EtcdMetadataStore(
            [auth_etcd.endpoint], timeout=2.0, security=_auth(password="not-the-password")
        )
    assert not isinstance(refused.value, MetadataStoreUnavailable)  # etcd answered: a setting
    assert "KAFSCALE_ETCD_PASSWORD" in str(refused.value) and "not-the-password" not in str(
        refused.value
    )


def test_no_credentials_for_an_authenticating_etcd_names_the_settings(
    auth_etcd: EtcdServer,
) -> None:
    store = EtcdMetadataStore([auth_etcd.endpoint], timeout=2.0)
    try:
        with pytest.raises(
            MetadataStoreError, match=r"authentication enabled.*KAFSCALE_ETCD_USERNAME"
        ):
            store.get("any")
    finally:
        store.close()
