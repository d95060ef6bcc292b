"""Listener settings as Kafka's: listeners, advertised listeners and the protocol map parsed, and
every mistake refused with the setting named."""

from __future__ import annotations

import pytest

from kafscale.security.listeners import Listener, SecurityProtocol, parse

P = SecurityProtocol


def test_a_pod_with_an_internal_plaintext_and_an_external_sasl_ssl_listener() -> None:
    found = parse(
        "INTERNAL://0.0.0.0:9092,EXTERNAL://:9094",
        "INTERNAL://kafscale-0.kafscale:9092,EXTERNAL://broker0.example.com:19094",
        "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
    )
    assert found == (
        Listener("INTERNAL", P.PLAINTEXT, "0.0.0.0", 9092, "kafscale-0.kafscale", 9092),
        Listener("EXTERNAL", P.SASL_SSL, "", 9094, "broker0.example.com", 19094),
    )
    assert [(x.protocol.tls, x.protocol.sasl) for x in found] == [(False, False), (True, True)]


def test_names_that_are_protocols_need_no_map() -> None:
    found = parse("PLAINTEXT://:9092, sasl_ssl://host:9094", broker_host="b0.example.com")
    assert [(x.name, x.protocol, x.advertised_host) for x in found] == [
        ("PLAINTEXT", P.PLAINTEXT, "b0.example.com"),  # binds everything: the broker's host
        ("SASL_SSL", P.SASL_SSL, "host"),
    ]


def test_a_listener_on_every_interface_advertises_the_brokers_host() -> None:
    found = parse("PLAINTEXT://0.0.0.0:9092,SSL://[::]:9093", broker_host="b0")
    assert [(x.host, x.advertised_host) for x in found] == [("0.0.0.0", "b0"), ("::", "b0")]


def test_ipv6_hosts_go_in_brackets() -> None:
    [found] = parse("SSL://[::1]:9093")
    assert (found.host, found.port, found.advertised_host) == ("::1", 9093, "::1")


@pytest.mark.parametrize(
    ("listeners", "advertised", "protocol_map", "message"),
    [
        ("", "", "", "no listener"),
        ("PLAINTEXT:9092", "", "", "not NAME://host:port"),
        ("PLAINTEXT://:0", "", "", "out of range"),
        ("PLAINTEXT://:70000", "", "", "out of range"),
        ("PLAINTEXT://:9092,plaintext://:9093", "", "", "named twice"),
        ("A://:9092,B://:9092", "", "A:SSL,B:SSL", "used twice"),
        ("INTERNAL://:9092", "", "", "not a security protocol"),
        ("INTERNAL://:9092", "", "INTERNAL:TLS", "not one of"),
        ("A://:9092,B://:9093", "", "A:SSL", "no protocol for B"),
        ("A://:9092", "", "A=SSL", "not NAME:PROTOCOL"),
        ("SSL://:9093", "PLAINTEXT://h:9092", "", "not in KAFSCALE_LISTENERS"),
        ("SSL://:9093", "SSL://0.0.0.0:9093", "", "not an address"),
    ],
)
def test_mistakes_are_refused_with_the_setting_named(
    listeners: str, advertised: str, protocol_map: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse(listeners, advertised, protocol_map)


def test_the_same_port_may_be_advertised_by_two_listeners_behind_a_proxy() -> None:
    found = parse("A://:9092,B://:9093", "A://lb:443,B://lb2:443", "A:SSL,B:SASL_SSL")
    assert [(x.advertised_host, x.advertised_port) for x in found] == [("lb", 443), ("lb2", 443)]
