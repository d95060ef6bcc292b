"""How the etcd client is configured, without a server: endpoints (``parse_endpoint`` and the
``KAFSCALE_ETCD_ENDPOINTS`` parser), the TLS and authentication settings and their files,
which endpoint is in use after failures (``EtcdCluster``), and how gRPC failures read
(``rpc_error``). Against real etcd: tests/integration/test_etcd_client.py.
"""

from __future__ import annotations

from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest

from kafscale.config import ConfigError, load
from kafscale.metadata import LeaseExpired, MetadataStoreError, MetadataStoreUnavailable
from kafscale.metadata.etcd import EtcdMetadataStore
from kafscale.metadata.etcd_channel import (
    CredentialsRefused,
    Endpoint,
    EtcdCluster,
    EtcdSecurity,
    parse_endpoint,
    rpc_error,
)

KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqG\n-----END PRIVATE KEY-----"


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("10.0.0.2:2379", Endpoint("10.0.0.2", 2379, None)),
        (" etcd-0.etcd:12379 ", Endpoint("etcd-0.etcd", 12379, None)),
        ("http://etcd-0:2379", Endpoint("etcd-0", 2379, False)),
        ("https://etcd-0:2379/", Endpoint("etcd-0", 2379, True)),
        ("etcd-0", Endpoint("etcd-0", 2379, None)),
        ("https://etcd-0", Endpoint("etcd-0", 2379, True)),
        ("[::1]:2379", Endpoint("[::1]", 2379, None)),
    ],
)
def test_parse_endpoint(text: str, endpoint: Endpoint) -> None:
    assert parse_endpoint(text) == endpoint


def test_parse_endpoint_refuses_another_scheme() -> None:
    with pytest.raises(MetadataStoreError, match="expected http:// or https://"):
        parse_endpoint("unix://etcd.sock:0")


def test_endpoints_setting_takes_every_form() -> None:
    config = load({"KAFSCALE_ETCD_ENDPOINTS": "a:2379, http://b:2379,https://c:2379"})
    assert config.etcd_endpoints == ("a:2379", "http://b:2379", "https://c:2379")


def test_credentials_in_an_endpoint_are_refused_pointing_at_the_settings() -> None:
    with pytest.raises(ConfigError, match="KAFSCALE_ETCD_USERNAME") as refused:
        load({"KAFSCALE_ETCD_ENDPOINTS": "https://root:hunter2@etcd-0:2379"})
    assert "hunter2" not in str(refused.value)


def test_tls_and_credentials_come_from_settings_and_files(tmp_path: Path) -> None:
    key_file, password_file = tmp_path / "client-key.pem", tmp_path / "password"
    key_file.write_text(KEY + "\n")
    password_file.write_text("hunter2\n")
    config = load(
        {
            "KAFSCALE_ETCD_ENDPOINTS": "https://etcd-0:2379",
            "KAFSCALE_ETCD_CA_FILE": "/etc/etcd/ca.pem",
            "KAFSCALE_ETCD_CERT_FILE": "/etc/etcd/client.pem",
            "KAFSCALE_ETCD_KEY_FILE": str(key_file),
            "KAFSCALE_ETCD_USERNAME": "kafscale",
            "KAFSCALE_ETCD_PASSWORD_FILE": str(password_file),
        }
    )
    assert (config.etcd_ca_file, config.etcd_cert_file) == (
        "/etc/etcd/ca.pem",
        "/etc/etcd/client.pem",
    )
    assert (config.etcd_key, config.etcd_username, config.etcd_password) == (
        KEY,
        "kafscale",
        "hunter2",
    )
    assert config.public_dict()["etcd_password"] == config.public_dict()["etcd_key"] == "***"
    assert "hunter2" not in repr(config) and "PRIVATE KEY" not in repr(config)
    assert set(config.secret_values()) == {KEY, "hunter2"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KAFSCALE_ETCD_CERT_FILE": "/c.pem"}, "KAFSCALE_ETCD_CERT_FILE and KAFSCALE_ETCD_KEY"),
        ({"KAFSCALE_ETCD_KEY": KEY}, "KAFSCALE_ETCD_CERT_FILE and KAFSCALE_ETCD_KEY"),
        ({"KAFSCALE_ETCD_USERNAME": "u"}, "KAFSCALE_ETCD_USERNAME and KAFSCALE_ETCD_PASSWORD"),
        ({"KAFSCALE_ETCD_PASSWORD": "p"}, "KAFSCALE_ETCD_USERNAME and KAFSCALE_ETCD_PASSWORD"),
    ],
)
def test_halves_of_a_pair_are_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load({"KAFSCALE_ETCD_ENDPOINTS": "etcd-0:2379", **environ})


def test_etcd_tls_or_authentication_without_endpoints_is_refused() -> None:
    with pytest.raises(ConfigError, match="KAFSCALE_ETCD_ENDPOINTS is empty"):
        load({"KAFSCALE_ETCD_CA_FILE": "/etc/etcd/ca.pem"})


def test_a_key_that_is_not_pem_is_refused_without_quoting_it() -> None:
    with pytest.raises(ConfigError, match=r"KAFSCALE_ETCD_KEY.*PEM private key") as refused:
        load({"KAFSCALE_ETCD_KEY": "not-a-key-at-all"})
    assert "not-a-key-at-all" not in str(refused.value)


# -- TLS files, read when the store opens --------------------------------------------------------


def _open(security: EtcdSecurity) -> None:
    EtcdMetadataStore(["https://127.0.0.1:1"], timeout=0.5, security=security)


def test_a_missing_ca_file_names_the_setting_and_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(MetadataStoreError, match=f"KAFSCALE_ETCD_CA_FILE='{missing}'.*No such"):
        _open(EtcdSecurity(ca_file=str(missing)))


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("hello\n")
    with pytest.raises(MetadataStoreError, match=r"KAFSCALE_ETCD_CA_FILE=.*no PEM certificate"):
        _open(EtcdSecurity(ca_file=str(tmp_path / "ca.pem")))


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(MetadataStoreError, match="needs its key"):
        _open(EtcdSecurity(cert_file=str(tmp_path / "client.pem")))


# -- failover bookkeeping -------------------------------------------------------------------------


def test_a_failed_endpoint_moves_the_pin_and_all_failing_in_a_row_is_an_outage() -> None:
    # Channels connect on their first call: none is made here.
    cluster = EtcdCluster(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], 1.0, EtcdSecurity())
    first, second, third = cluster.members
    try:
        assert cluster.member is first
        assert not cluster.failed(first)
        assert cluster.member is second
        assert not cluster.failed(first)  # a second call that was in flight on `first`
        assert cluster.member is second
        assert not cluster.failed(second)
        assert cluster.failed(third)  # every endpoint failed in a row
        assert cluster.member is first
        cluster.answered()
        assert not cluster.failed(first)  # counted afresh after an answer
        cluster.pin(third)
        assert cluster.member is third
    finally:
        cluster.close()


# -- what a gRPC failure reads as ------------------------------------------------------------------


class _Failure(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_rpc_errors_name_the_endpoint_and_the_cause() -> None:
    unavailable = rpc_error(_Failure(grpc.StatusCode.UNAVAILABLE, "connection refused"), "e:1")
    assert isinstance(unavailable, MetadataStoreUnavailable)
    assert str(unavailable) == "etcd at e:1 is unreachable: connection refused"
    deadline = rpc_error(_Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), "e:1")
    assert isinstance(deadline, MetadataStoreUnavailable)
    tls = rpc_error(
        _Failure(grpc.StatusCode.UNAVAILABLE, "Ssl handshake failed: CERTIFICATE_VERIFY_FAILED"),
        "e:1",
    )
    assert isinstance(tls, MetadataStoreUnavailable) and "KAFSCALE_ETCD_CA_FILE" in str(tls)
    lease = rpc_error(
        _Failure(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"), "e:1"
    )
    assert isinstance(lease, LeaseExpired)
    refused = rpc_error(
        _Failure(
            grpc.StatusCode.INVALID_ARGUMENT,
            "etcdserver: authentication failed, invalid user ID or password",
        ),
        "e:1",
    )
    assert isinstance(refused, CredentialsRefused) and "KAFSCALE_ETCD_PASSWORD" in str(refused)
    anonymous = rpc_error(
        _Failure(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty"), "e:1"
    )
    assert type(anonymous) is MetadataStoreError and "KAFSCALE_ETCD_USERNAME" in str(anonymous)


def test_only_an_authenticating_client_retries_a_refused_token() -> None:
    expired = _Failure(grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
    old = _Failure(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old")
    denied = _Failure(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
    with_user = EtcdCluster(["127.0.0.1:1"], 1.0, EtcdSecurity(username="u", password="p"))
    anonymous = EtcdCluster(["127.0.0.1:1"], 1.0, EtcdSecurity())
    try:
        assert with_user.token_rejected(expired) and with_user.token_rejected(old)
        assert not with_user.token_rejected(denied)
        assert not anonymous.token_rejected(expired)
    finally:
        with_user.close()
        anonymous.close()
