"""The metrics port (``kafscale.supervisor.health``) over real HTTP: health bodies say which
dependency is not ready and never an exception's text; ``POST /flush`` needs the admin token,
and a refused request flushes nothing. ``kafscale flush`` sends the token from the environment."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafscale import cli
from kafscale.security.tls import TlsFiles
from kafscale.supervisor import admin, health
from tests.harness.tls import make_pki

TOKEN = "0123456789abcdef-admin"
LEAKY = "ConnectTimeout: http://10.1.2.3:9000/bucket-of-record AKIAIOSFODNN7EXAMPLE"


def fail() -> None:
    raise OSError(LEAKY)


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The flushes the server carried out (none of the real shards exist here)."""
    calls: list[str] = []

    def flush_all(runtime_dir: str, children: list[object]) -> admin.FlushOutcome:
        calls.append(runtime_dir)
        return admin.FlushOutcome(partitions=7)

    monkeypatch.setattr(admin, "flush_all", flush_all)
    return calls


@contextlib.contextmanager
def running(
    runtime_dir: Path, admin_token: str = "", checks: dict[str, Callable[[], None]] | None = None
) -> Iterator[str]:
    """A metrics server, its checker's first verdict in; yields its base URL."""
    checker = health.HealthChecker(str(runtime_dir), [], checks or {})
    server = health.HealthServer("127.0.0.1", 0, checker, admin_token)
    checker.start()
    server.start()
    try:
        deadline = time.monotonic() + 30
        while checker.verdict.problems == ["starting"]:  # the first check runs at once
            assert time.monotonic() < deadline, "the health checker never checked"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.httpd.server_address[1]}"
    finally:
        checker.stop()
        server.stop()


@pytest.fixture(scope="module")
def with_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(tmp_path_factory.mktemp("run"), TOKEN, {"objects": lambda: None}) as url:
        yield url


@pytest.fixture(scope="module")
def without_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(tmp_path_factory.mktemp("run")) as url:
        yield url


def request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method=method, headers=headers or {}), timeout=30
        ) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_readyz_names_the_backend_not_the_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with running(tmp_path, checks={"objects": fail, "metadata": fail}) as base:
        status, _, body = request(base + "/readyz")
        healthz = request(base + "/healthz")
    assert status == 503
    assert json.loads(body) == {
        "ready": False,
        "problems": ["objects backend is not reachable", "metadata backend is not reachable"],
    }
    for piece in ("10.1.2.3", "bucket-of-record", "AKIA", "ConnectTimeout"):
        assert piece.encode() not in body
    logged = [r for r in caplog.records if r.getMessage() == "backend check failed"]
    assert {(r.__dict__["backend"], r.__dict__["error"]) for r in logged} == {
        ("objects", LEAKY),
        ("metadata", LEAKY),
    }  # the details are in the log, for the operator
    assert healthz[:3:2] == (200, b"ok\n")


def test_readyz_is_ok_when_everything_answers(with_token: str) -> None:
    status, _, body = request(with_token + "/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True, "problems": []})


def test_flush_without_a_configured_token_is_disabled(
    without_token: str, flushes: list[str]
) -> None:
    base = without_token
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {TOKEN}"}):
        status, _, body = request(base + "/flush", "POST", headers)
        assert status == 403 and b"KAFSCALE_ADMIN_TOKEN" in body
    assert flushes == []


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong-token-0123456789",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
    ],
)
def test_flush_with_a_missing_or_wrong_token_is_refused_and_does_nothing(
    with_token: str, flushes: list[str], authorization: str | None
) -> None:
    base = with_token
    headers = {} if authorization is None else {"Authorization": authorization}
    status, response_headers, body = request(base + "/flush", "POST", headers)
    assert status == 401
    assert response_headers["WWW-Authenticate"] == 'Bearer realm="kafscale"'
    assert TOKEN.encode() not in body
    assert flushes == []


def test_flush_with_the_token_flushes(with_token: str, flushes: list[str]) -> None:
    base = with_token
    status, _, body = request(base + "/flush", "POST", {"Authorization": f"bearer  {TOKEN} "})
    assert (status, json.loads(body)) == (
        200,
        {"flushed": True, "partitions": 7, "problems": []},
    )
    assert len(flushes) == 1


def test_the_metrics_port_serves_nothing_else(with_token: str) -> None:
    base = with_token
    assert request(base + "/admin")[0] == 404
    assert request(base + "/flush")[0] == 404  # GET is not a flush
    assert request(base + "/readyz", "POST", {"Authorization": f"Bearer {TOKEN}"})[0] == 404
    assert request(base + "/flush", "DELETE")[0] == 501


def test_kafscale_flush_sends_the_token_from_a_file(
    with_token: str,
    flushes: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = with_token
    monkeypatch.delenv("KAFSCALE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("KAFSCALE_ADMIN_TOKEN_FILE", raising=False)
    assert cli.main(["flush", "--metrics-url", base]) == 1
    assert "set KAFSCALE_ADMIN_TOKEN" in capsys.readouterr().err
    assert flushes == []
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("KAFSCALE_ADMIN_TOKEN_FILE", str(token_file))
    assert cli.main(["flush", "--metrics-url", base]) == 0
    assert json.loads(capsys.readouterr().out)["flushed"] is True
    assert len(flushes) == 1


def test_authorized_compares_the_whole_token() -> None:
    assert health.authorized(f"Bearer {TOKEN}", TOKEN)
    assert not health.authorized(f"Bearer {TOKEN}", "")
    assert not health.authorized("Bearer ", "")
    assert not health.authorized(None, TOKEN)
    assert not health.authorized(f"Bearer {TOKEN.upper()}", TOKEN)


def test_drain_needs_the_token_and_answers_what_is_left(tmp_path: Path) -> None:
    drains: list[int] = []

    def drain() -> int | None:
        drains.append(1)
        return 0 if len(drains) > 1 else 3

    checker = health.HealthChecker(str(tmp_path), [], {})
    server = health.HealthServer("127.0.0.1", 0, checker, TOKEN, drain=drain)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.httpd.server_address[1]}"
        assert request(base + "/drain", "POST")[0] == 401 and drains == []
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, _, body = request(base + "/drain", "POST", auth)
        assert (status, json.loads(body)) == (503, {"drained": False, "partitions_left": 3})
        status, _, body = request(base + "/drain", "POST", auth)
        assert (status, json.loads(body)) == (200, {"drained": True, "partitions_left": 0})
    finally:
        server.stop()


def test_a_server_without_a_drain_has_no_drain(with_token: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert request(with_token + "/drain", "POST", auth)[0] == 404


# -- HTTPS and basic authentication (issue 17) ------------------------------------------------


@contextlib.contextmanager
def secured(
    runtime_dir: Path, access: health.Access, tls_files: TlsFiles | None = None
) -> Iterator[tuple[str, int]]:
    checker = health.HealthChecker(str(runtime_dir), [], {})
    server = health.HealthServer("127.0.0.1", 0, checker, access=access, tls_files=tls_files)
    server.start()
    try:
        yield "127.0.0.1", int(server.httpd.server_address[1])
    finally:
        server.stop()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_authentication_guards_metrics_and_leaves_health_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = tmp_path / "samples"  # the supervisor's prometheus multiprocess directory
    samples.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(samples))
    with secured(tmp_path, health.Access("prometheus", "scrape-secret")) as (host, port):
        url = f"http://{host}:{port}"
        status, headers, _ = request(f"{url}/metrics")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert request(f"{url}/metrics", headers=basic("prometheus", "wrong"))[0] == 401
        assert request(f"{url}/metrics", headers=basic("other", "scrape-secret"))[0] == 401
        assert request(f"{url}/metrics", headers={"Authorization": "Basic !!"})[0] == 401
        status, _, body = request(f"{url}/metrics", headers=basic("prometheus", "scrape-secret"))
        assert status == 200 and body is not None
        assert request(f"{url}/healthz")[0] == 200  # the kubelet's probes need no credentials


def test_basic_authentication_can_guard_health_too(tmp_path: Path) -> None:
    with secured(tmp_path, health.Access("ops", "ops-secret", health_too=True)) as (host, port):
        url = f"http://{host}:{port}"
        assert request(f"{url}/healthz")[0] == 401
        assert request(f"{url}/readyz")[0] == 401
        assert request(f"{url}/healthz", headers=basic("ops", "ops-secret"))[0] == 200


def test_the_metrics_port_serves_https(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    files = TlsFiles(str(pki.server_cert), str(pki.server_key))
    with secured(tmp_path, health.Access(), files) as (host, port):
        trusted = ssl.create_default_context(cafile=str(pki.ca_file))
        with urllib.request.urlopen(f"https://{host}:{port}/healthz", context=trusted) as answer:
            assert answer.status == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: refused
            urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=10)
        stranger = ssl.create_default_context(cafile=str(pki.other_ca_file))
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"https://{host}:{port}/healthz", context=stranger)
        # A client that connects and sends nothing does not hold up the others.
        with (
            socket.create_connection((host, port)),
            urllib.request.urlopen(
                f"https://{host}:{port}/healthz", context=trusted, timeout=10
            ) as answer,
        ):
            assert answer.status == 200
