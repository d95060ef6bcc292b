"""The pure connection limits: quotas per broker and per address, idle expiry, log limiting."""

from __future__ import annotations

import pytest

from kafscale.config import ConfigError, load
from kafscale.frontend.limits import (
    OTHER_KEYS,
    Admission,
    ConnectionQuotas,
    IdleExpiry,
    LogLimiter,
    address_key,
)


def test_address_key_counts_mapped_ipv4_as_ipv4() -> None:
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert address_key("10.0.0.1") == "10.0.0.1"
    assert address_key("0:0::1") == "::1"
    assert address_key("fe80::1%eth0") == "fe80::1"
    assert address_key("not-an-ip") == "not-an-ip"


def test_quotas_refuse_past_the_per_address_limit_and_free_on_release() -> None:
    quotas = ConnectionQuotas(max_connections=10, max_connections_per_ip=2)
    assert quotas.admit("10.0.0.1") is Admission.ADMITTED
    assert quotas.admit("10.0.0.1") is Admission.ADMITTED
    assert quotas.admit("10.0.0.1") is Admission.OVER_MAX_CONNECTIONS_PER_IP
    assert quotas.admit("10.0.0.2") is Admission.ADMITTED  # another address is not affected
    assert (quotas.total, quotas.count("10.0.0.1"), quotas.count("10.0.0.2")) == (3, 2, 1)
    quotas.release("10.0.0.1")
    assert quotas.admit("10.0.0.1") is Admission.ADMITTED
    for _ in range(2):
        quotas.release("10.0.0.1")
    quotas.release("10.0.0.2")
    assert quotas.total == 0 and quotas.count("10.0.0.1") == 0 and quotas.count("10.0.0.2") == 0


def test_quotas_broker_wide_limit_comes_first() -> None:
    quotas = ConnectionQuotas(max_connections=2, max_connections_per_ip=5)
    assert quotas.admit("10.0.0.1") is Admission.ADMITTED
    assert quotas.admit("10.0.0.2") is Admission.ADMITTED
    assert not quotas.has_slot()
    assert quotas.admit("10.0.0.3") is Admission.OVER_MAX_CONNECTIONS
    assert quotas.total == 2 and quotas.count("10.0.0.3") == 0  # a refusal is not counted
    quotas.release("10.0.0.2")
    assert quotas.has_slot()
    assert quotas.admit("10.0.0.3") is Admission.ADMITTED


def test_quotas_overrides_raise_or_lower_one_address() -> None:
    quotas = ConnectionQuotas(
        max_connections=100,
        max_connections_per_ip=1,
        overrides={"::ffff:127.0.0.1": 3, "10.0.0.9": 0},
    )
    assert quotas.limit_for("127.0.0.1") == 3  # keys are normalised like client addresses
    assert [quotas.admit("127.0.0.1") for _ in range(4)] == [Admission.ADMITTED] * 3 + [
        Admission.OVER_MAX_CONNECTIONS_PER_IP
    ]
    assert quotas.admit("10.0.0.9") is Admission.OVER_MAX_CONNECTIONS_PER_IP
    assert quotas.admit("10.0.0.8") is Admission.ADMITTED
    assert quotas.admit("10.0.0.8") is Admission.OVER_MAX_CONNECTIONS_PER_IP


def test_idle_connection_expires_after_max_idle_and_is_reported_once() -> None:
    idle: IdleExpiry[str] = IdleExpiry(10.0)
    idle.opened("a", now=0.0)
    idle.opened("b", now=5.0)
    assert idle.next_expiry() == 10.0
    assert idle.expired(now=9.99) == []
    assert idle.expired(now=10.0) == ["a"]
    assert idle.expired(now=14.0) == []
    assert idle.expired(now=15.0) == ["b"]
    assert idle.expired(now=100.0) == []
    assert idle.next_expiry() is None


def test_bytes_received_restart_the_idle_clock() -> None:
    idle: IdleExpiry[str] = IdleExpiry(10.0)
    idle.opened("a", now=0.0)
    idle.opened("b", now=1.0)
    idle.active("a", now=8.0)  # a is now the most recently active
    assert idle.next_expiry() == 11.0
    assert idle.expired(now=12.0) == ["b"]
    assert idle.expired(now=17.9) == []
    assert idle.expired(now=18.0) == ["a"]


def test_request_in_progress_is_never_idle() -> None:
    """A parked long-poll Fetch keeps its connection open however long it waits."""
    idle: IdleExpiry[str] = IdleExpiry(10.0)
    idle.opened("a", now=0.0)
    idle.request_started("a")
    idle.request_started("a")  # pipelined
    idle.active("a", now=1.0)  # bytes received while busy change nothing
    assert idle.is_busy("a")
    assert idle.expired(now=1000.0) == []
    idle.request_finished("a", now=1000.0)
    assert idle.expired(now=2000.0) == []  # one still in progress
    idle.request_finished("a", now=2000.0)
    assert not idle.is_busy("a")
    assert idle.expired(now=2009.0) == []  # the clock restarts when the last one ends
    assert idle.expired(now=2010.0) == ["a"]


def test_closed_connection_is_forgotten_even_if_a_request_ends_later() -> None:
    idle: IdleExpiry[str] = IdleExpiry(10.0)
    idle.opened("a", now=0.0)
    idle.request_started("a")
    idle.closed("a")
    idle.request_finished("a", now=5.0)  # a cancelled task's callback, after the close
    assert idle.expired(now=1000.0) == []
    assert idle.next_expiry() is None


def test_disabled_idle_expiry_expires_nothing() -> None:
    idle: IdleExpiry[str] = IdleExpiry(None)
    idle.opened("a", now=0.0)
    assert idle.expired(now=1e12) == []
    assert idle.next_expiry() is None


def test_log_limiter_one_line_per_key_per_interval_with_the_count_held_back() -> None:
    limiter = LogLimiter(interval=10.0)
    assert limiter.allow("10.0.0.1", now=0.0) == 0
    assert [limiter.allow("10.0.0.1", now=t) for t in (1.0, 2.0, 9.9)] == [None, None, None]
    assert limiter.allow("10.0.0.2", now=5.0) == 0  # keys are independent
    assert limiter.allow("10.0.0.1", now=10.0) == 3
    assert limiter.allow("10.0.0.1", now=25.0) == 0


def test_log_limiter_memory_is_bounded_under_a_flood_of_keys() -> None:
    limiter = LogLimiter(interval=10.0, max_keys=4)
    assert [limiter.allow(f"10.0.0.{i}", now=0.0) for i in range(4)] == [0, 0, 0, 0]
    # Every window still open: new keys share one line.
    assert limiter.allow("10.0.1.1", now=1.0) == 0
    assert limiter.allow("10.0.1.2", now=2.0) is None
    assert limiter.allow("10.0.1.3", now=3.0) is None
    assert len(limiter._windows) == 5
    assert OTHER_KEYS in limiter._windows
    # Once windows expire, new keys get their own again.
    assert limiter.allow("10.0.2.1", now=20.0) == 0
    assert len(limiter._windows) <= 5


def test_connection_settings_parse_and_reject_bad_values() -> None:
    config = load(
        {
            "KAFSCALE_MAX_CONNECTIONS": "50",
            "KAFSCALE_MAX_CONNECTIONS_PER_IP": "5",
            "KAFSCALE_MAX_CONNECTIONS_PER_IP_OVERRIDES": "127.0.0.1:20, [::1]:7,10.1.2.3:0",
            "KAFSCALE_CONNECTIONS_MAX_IDLE_MS": "-1",
            "KAFSCALE_CONNECTION_MAX_IN_FLIGHT_BYTES": "1MiB",
        }
    )
    assert (config.max_connections, config.max_connections_per_ip) == (50, 5)
    assert config.max_connections_per_ip_overrides == (
        ("127.0.0.1", 20),
        ("::1", 7),
        ("10.1.2.3", 0),
    )
    assert config.connections_max_idle_ms == -1
    assert config.connection_max_in_flight_bytes == 1024 * 1024
    assert type(config).from_json_dict(config.to_json_dict()) == config
    defaults = load({})
    assert defaults.connections_max_idle_ms == 600_000  # Kafka's 10 minutes
    assert defaults.max_connections_per_ip_overrides == ()
    for variable, value in (
        ("KAFSCALE_MAX_CONNECTIONS_PER_IP_OVERRIDES", "localhost:5"),
        ("KAFSCALE_MAX_CONNECTIONS_PER_IP_OVERRIDES", "127.0.0.1"),
        ("KAFSCALE_MAX_CONNECTIONS_PER_IP_OVERRIDES", "127.0.0.1:-2"),
        ("KAFSCALE_CONNECTIONS_MAX_IDLE_MS", "0"),
        ("KAFSCALE_MAX_CONNECTIONS", "0"),
        ("KAFSCALE_CONNECTION_MAX_IN_FLIGHT_REQUESTS", "0"),
    ):
        with pytest.raises(ConfigError, match=variable):
            load({variable: value})
