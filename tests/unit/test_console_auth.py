"""Console sessions, CSRF tokens, login throttling and settings: the pure parts of the login."""

from __future__ import annotations

import pytest

from kafscale.console import settings as console_settings
from kafscale.console.auth import Sessions, Throttle, same_secret


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_is_found_by_its_id_until_it_idles_out() -> None:
    clock = Clock()
    sessions = Sessions(idle=60, lifetime=3600, clock=clock)
    session = sessions.create("alice")
    assert sessions.get(session.id) is session
    clock.now += 59
    assert sessions.get(session.id) is session  # used: the idle time starts again
    clock.now += 59
    assert sessions.get(session.id) is session
    clock.now += 61
    assert sessions.get(session.id) is None
    assert len(sessions) == 0


def test_a_session_ends_at_its_lifetime_however_busy() -> None:
    clock = Clock()
    sessions = Sessions(idle=60, lifetime=100, clock=clock)
    session = sessions.create("alice")
    for _ in range(3):
        clock.now += 30
        assert sessions.get(session.id) is session
    clock.now += 30
    assert sessions.get(session.id) is None


def test_ids_and_tokens_are_random_and_unknown_ids_find_nothing() -> None:
    sessions = Sessions(idle=60, lifetime=100)
    a, b = sessions.create("alice"), sessions.create("alice")
    assert a.id != b.id and a.csrf != b.csrf and a.id != a.csrf
    assert len(a.id) >= 40
    assert sessions.get("") is None
    assert sessions.get(a.id[:-1]) is None
    assert sessions.get(None) is None


def test_csrf_token_must_match_exactly() -> None:
    session = Sessions(idle=60, lifetime=100).create("alice")
    assert session.check_csrf(session.csrf)
    assert not session.check_csrf(None)
    assert not session.check_csrf("")
    assert not session.check_csrf(session.csrf + "x")
    other = Sessions(idle=60, lifetime=100).create("alice")
    assert not session.check_csrf(other.csrf)


def test_ending_a_session_closes_what_it_holds() -> None:
    sessions = Sessions(idle=60, lifetime=100)
    session = sessions.create("alice")
    closed: list[str] = []
    session.on_close.append(lambda: closed.append("kafka"))
    sessions.end(session.id)
    assert closed == ["kafka"]
    assert sessions.get(session.id) is None
    sessions.end(session.id)  # twice: nothing more
    assert closed == ["kafka"]


def test_expire_ends_only_stale_sessions() -> None:
    clock = Clock()
    sessions = Sessions(idle=60, lifetime=3600, clock=clock)
    old = sessions.create("old")
    clock.now += 50
    fresh = sessions.create("fresh")
    clock.now += 20
    assert sessions.expire() == 1
    assert sessions.get(old.id) is None
    assert sessions.get(fresh.id) is fresh


def test_same_secret() -> None:
    assert same_secret("hunter2", "hunter2")
    assert not same_secret("hunter", "hunter2")
    assert not same_secret("", "hunter2")


def test_throttle_lets_a_few_failures_pass_then_doubles_the_wait() -> None:
    clock = Clock()
    throttle = Throttle(free=3, base=1.0, ceiling=10.0, clock=clock)
    for _ in range(3):
        assert throttle.wait("addr:a", "user:x") == 0
        throttle.failed("addr:a", "user:x")
    assert throttle.wait("addr:a") == pytest.approx(1.0)
    throttle.failed("addr:a", "user:x")
    assert throttle.wait("addr:a") == pytest.approx(2.0)
    assert throttle.wait("user:x", "addr:b") == pytest.approx(2.0)  # the user name is throttled too
    assert throttle.wait("addr:b", "user:y") == 0
    for _ in range(10):
        throttle.failed("addr:a")
    assert throttle.wait("addr:a") == pytest.approx(10.0)  # the ceiling
    clock.now += 10
    assert throttle.wait("addr:a") == 0
    throttle.succeeded("addr:a", "user:x")
    throttle.failed("addr:a")
    assert throttle.wait("addr:a", "user:x") == 0


ENV = {"KAFSCALE_UI_USERNAME": "admin", "KAFSCALE_UI_PASSWORD": "s3cret"}


def test_settings_defaults() -> None:
    found = console_settings.load(ENV)
    assert (found.host, found.port, found.bootstrap, found.auth) == (
        "0.0.0.0",
        8088,
        "localhost:9092",
        "basic",
    )
    assert found.metadata is False and found.metrics_urls == ()
    assert "s3cret" not in repr(found)


@pytest.mark.parametrize(
    "missing", [{}, {"KAFSCALE_UI_USERNAME": "admin"}, {"KAFSCALE_UI_PASSWORD": "x"}]
)
def test_no_login_configured_refuses_and_names_the_variable(missing: dict[str, str]) -> None:
    with pytest.raises(ValueError) as refused:
        console_settings.load(missing)
    named = str(refused.value).split(" not set")[0]
    for env in ("KAFSCALE_UI_USERNAME", "KAFSCALE_UI_PASSWORD"):
        assert (env in named) == (env not in missing)
    assert "no default login" in str(refused.value)


def test_password_from_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    found = console_settings.load(
        {"KAFSCALE_UI_USERNAME": "admin", "KAFSCALE_UI_PASSWORD_FILE": str(secret)}
    )
    assert found.ui_password == "from-file"
    with pytest.raises(ValueError, match="both set"):
        console_settings.load({**ENV, "KAFSCALE_UI_PASSWORD_FILE": str(secret)})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"KAFSCALE_CONSOLE_AUTH": "ldap"}, "KAFSCALE_CONSOLE_AUTH"),
        ({"KAFSCALE_CONSOLE_PORT": "70000"}, "KAFSCALE_CONSOLE_PORT"),
        ({"KAFSCALE_CONSOLE_BOOTSTRAP": "nohost"}, "KAFSCALE_CONSOLE_BOOTSTRAP"),
        ({"KAFSCALE_CONSOLE_METRICS_URLS": "ftp://x"}, "KAFSCALE_CONSOLE_METRICS_URLS"),
        ({"KAFSCALE_CONSOLE_AUTH": "sasl"}, "SASL_SSL or SASL_PLAINTEXT"),
        ({"KAFSCALE_CONSOLE_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFSCALE_CONSOLE_SASL_USERNAME"),
        ({"KAFSCALE_CONSOLE_SECURE_COOKIES": "maybe"}, "KAFSCALE_CONSOLE_SECURE_COOKIES"),
    ],
)
def test_bad_settings_name_their_variable(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        console_settings.load({**ENV, **extra})


def test_sasl_login_needs_no_ui_password() -> None:
    found = console_settings.load(
        {"KAFSCALE_CONSOLE_AUTH": "sasl", "KAFSCALE_CONSOLE_SECURITY_PROTOCOL": "sasl_ssl"}
    )
    assert (found.auth, found.security_protocol) == ("sasl", "SASL_SSL")


def test_metadata_auto_follows_the_brokers_settings() -> None:
    assert console_settings.load({**ENV, "KAFSCALE_DATA_DIR": "/data"}).metadata
    assert console_settings.load({**ENV, "KAFSCALE_ETCD_ENDPOINTS": "e:2379"}).metadata
    assert not console_settings.load(
        {**ENV, "KAFSCALE_DATA_DIR": "/d", "KAFSCALE_CONSOLE_METADATA": "off"}
    ).metadata
    assert console_settings.load({**ENV, "KAFSCALE_CONSOLE_METADATA": "on"}).metadata


def test_every_console_setting_is_in_the_docs_table() -> None:
    from tests.harness.paths import ROOT

    table = (ROOT / "docs" / "console.md").read_text()
    for setting in console_settings.SETTINGS:
        assert f"| `{setting.env}` | " in table, setting.env
