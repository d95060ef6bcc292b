"""Listener, TLS and SASL settings (``kafscale.config.load``, ``Config.kafka_listeners``,
``_check_listeners``; ``sasl_enabled_mechanisms`` and ``sasl_admin_user`` of
``kafscale.settings``) and the listeners of a broker's registration
(``kafscale.metadata.records.BrokerRecord``).

Covered:

- the default: one PLAINTEXT listener at KAFSCALE_BROKER_HOST:KAFSCALE_BROKER_PORT, advertised
  at KAFSCALE_ADVERTISED_HOST (else the bind host);
- several listeners with a protocol map and advertised listeners; each name its protocol when
  there is no map;
- refusals, each a ``ConfigError`` naming what to fix (never a bare ``ValueError``): an SSL or
  SASL_SSL listener without the certificate and key files; KAFSCALE_SSL_CLIENT_AUTH without a CA
  file; the metrics port equal to a listener's port; a SASL mechanism Kafka clients could not use
  here; the admin user without its password and vice versa; malformed listener strings;
- the admin password read from KAFSCALE_SASL_ADMIN_PASSWORD_FILE, and kept out of ``repr``;
- ``BrokerRecord.endpoint``: an old registration (no ``listeners``) answers for PLAINTEXT only,
  a new one per name and None for a name it lacks; a registration in the old JSON decodes.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kafscale.config import Config, ConfigError, load
from kafscale.metadata import records
from kafscale.metadata.records import BrokerRecord
from kafscale.security.listeners import Listener, SecurityProtocol

PLAINTEXT, SSL = SecurityProtocol.PLAINTEXT, SecurityProtocol.SSL
SASL_PLAINTEXT, SASL_SSL = SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL
TLS_FILES = {"KAFSCALE_SSL_CERT_FILE": "/tls/cert.pem", "KAFSCALE_SSL_KEY_FILE": "/tls/key.pem"}


def refused(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as raised:
        load(environ)
    return str(raised.value)


# -- the default listener ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {},
            Listener("PLAINTEXT", PLAINTEXT, "127.0.0.1", 9092, "127.0.0.1", 9092),
            id="defaults",
        ),
        pytest.param(
            {"KAFSCALE_BROKER_HOST": "10.1.2.3", "KAFSCALE_BROKER_PORT": "19092"},
            Listener("PLAINTEXT", PLAINTEXT, "10.1.2.3", 19092, "10.1.2.3", 19092),
            id="broker host and port",
        ),
        pytest.param(
            {
                "KAFSCALE_BROKER_HOST": "0.0.0.0",
                "KAFSCALE_BROKER_PORT": "29092",
                "KAFSCALE_ADVERTISED_HOST": "kafka-0.kafka.svc",
            },
            Listener("PLAINTEXT", PLAINTEXT, "0.0.0.0", 29092, "kafka-0.kafka.svc", 29092),
            id="advertised host",
        ),
    ],
)
def test_the_default_is_one_plaintext_listener(environ: dict[str, str], expected: Listener) -> None:
    config = load(environ)
    assert config.kafka_listeners == (expected,)
    assert config.primary_listener == expected


def test_the_default_listener_on_every_interface_advertises_a_connectable_host() -> None:
    [listener] = load({"KAFSCALE_BROKER_HOST": "0.0.0.0"}).kafka_listeners
    assert listener.host == "0.0.0.0"
    assert listener.advertised_host not in ("", "0.0.0.0", "::")


def test_broker_port_is_not_used_once_listeners_are_set() -> None:
    config = load({"KAFSCALE_BROKER_PORT": "19092", "KAFSCALE_LISTENERS": "PLAINTEXT://:29092"})
    assert [(x.port, x.advertised_port) for x in config.kafka_listeners] == [(29092, 29092)]


# -- several listeners -------------------------------------------------------------------------


def test_several_listeners_with_a_protocol_map() -> None:
    config = load(
        {
            "KAFSCALE_LISTENERS": (
                "INTERNAL://:9092, external://0.0.0.0:9094,REPLICAS://10.0.0.5:9096,"
                "TLS://[::1]:9095"
            ),
            "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": (
                "internal:PLAINTEXT,EXTERNAL:sasl_ssl,REPLICAS:SASL_PLAINTEXT,TLS:SSL"
            ),
            "KAFSCALE_ADVERTISED_LISTENERS": "EXTERNAL://kafka.example.com:19094",
            "KAFSCALE_BROKER_HOST": "10.0.0.5",
            "KAFSCALE_ADVERTISED_HOST": "kafka-0.internal",
            "KAFSCALE_METRICS_PORT": "9100",
            **TLS_FILES,
        }
    )
    assert config.kafka_listeners == (
        Listener("INTERNAL", PLAINTEXT, "", 9092, "kafka-0.internal", 9092),
        Listener("EXTERNAL", SASL_SSL, "0.0.0.0", 9094, "kafka.example.com", 19094),
        Listener("REPLICAS", SASL_PLAINTEXT, "10.0.0.5", 9096, "10.0.0.5", 9096),
        Listener("TLS", SSL, "::1", 9095, "::1", 9095),
    )
    assert config.primary_listener.name == "INTERNAL"


def test_without_a_map_each_name_is_its_protocol() -> None:
    config = load(
        {
            "KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9094,SASL_SSL://:9095",
            "KAFSCALE_BROKER_HOST": "broker.local",
            **TLS_FILES,
        }
    )
    assert [(x.name, x.protocol, x.advertised_host) for x in config.kafka_listeners] == [
        ("PLAINTEXT", PLAINTEXT, "broker.local"),
        ("SASL_PLAINTEXT", SASL_PLAINTEXT, "broker.local"),
        ("SASL_SSL", SASL_SSL, "broker.local"),
    ]


def test_the_configuration_survives_the_childrens_config_file() -> None:
    config = load(
        {
            "KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_SSL://:9095",
            "KAFSCALE_SASL_ENABLED_MECHANISMS": "plain, SCRAM-SHA-256",
            "KAFSCALE_SASL_ADMIN_USER": "admin",
            "KAFSCALE_SASL_ADMIN_PASSWORD": "admin-secret",
            **TLS_FILES,
        }
    )
    copy = Config.from_json_dict(msgspec.json.decode(msgspec.json.encode(config.to_json_dict())))
    assert copy == config
    assert copy.kafka_listeners == config.kafka_listeners
    assert copy.sasl_enabled_mechanisms == ("PLAIN", "SCRAM-SHA-256")


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({"KAFSCALE_LISTENERS": "SSL://:9094"}, id="SSL, no files"),
        pytest.param({"KAFSCALE_LISTENERS": "SASL_SSL://:9094"}, id="SASL_SSL, no files"),
        pytest.param(
            {"KAFSCALE_LISTENERS": "SSL://:9094", "KAFSCALE_SSL_CERT_FILE": "/tls/cert.pem"},
            id="no key file",
        ),
        pytest.param(
            {"KAFSCALE_LISTENERS": "SASL_SSL://:9094", "KAFSCALE_SSL_KEY_FILE": "/tls/key.pem"},
            id="no cert file",
        ),
        pytest.param(
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SECURE://:9094",
                "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,SECURE:SSL",
            },
            id="mapped to SSL",
        ),
    ],
)
def test_a_tls_listener_needs_the_certificate_and_key_files(environ: dict[str, str]) -> None:
    message = refused(environ)
    assert "KAFSCALE_SSL_CERT_FILE" in message and "KAFSCALE_SSL_KEY_FILE" in message


def test_tls_files_are_not_needed_without_a_tls_listener() -> None:
    config = load({"KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9094"})
    assert not any(x.protocol.tls for x in config.kafka_listeners)


@pytest.mark.parametrize("mode", ["required", "requested"])
def test_client_certificates_need_a_ca_file(mode: str) -> None:
    environ = {"KAFSCALE_LISTENERS": "SSL://:9094", "KAFSCALE_SSL_CLIENT_AUTH": mode, **TLS_FILES}
    message = refused(environ)
    assert "KAFSCALE_SSL_CLIENT_AUTH" in message and "KAFSCALE_SSL_CA_FILE" in message
    config = load({**environ, "KAFSCALE_SSL_CA_FILE": "/tls/ca.pem"})
    assert (config.ssl_client_auth, config.ssl_ca_file) == (mode, "/tls/ca.pem")


def test_an_unknown_client_auth_mode_is_refused() -> None:
    assert "KAFSCALE_SSL_CLIENT_AUTH" in refused({"KAFSCALE_SSL_CLIENT_AUTH": "always"})


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param({"KAFSCALE_METRICS_PORT": "9092"}, "KAFSCALE_BROKER_PORT", id="default"),
        pytest.param(
            {"KAFSCALE_BROKER_PORT": "19092", "KAFSCALE_METRICS_PORT": "19092"},
            "KAFSCALE_BROKER_PORT",
            id="broker port",
        ),
        pytest.param(
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9200",
                "KAFSCALE_METRICS_PORT": "9200",
            },
            "KAFSCALE_LISTENERS",
            id="second listener",
        ),
        pytest.param(
            {"KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_SSL://:9093", **TLS_FILES},
            "KAFSCALE_LISTENERS",
            id="second listener on the default metrics port",
        ),
    ],
)
def test_the_metrics_port_differs_from_every_listener_port(
    environ: dict[str, str], named: str
) -> None:
    message = refused(environ)
    assert "KAFSCALE_METRICS_PORT" in message and named in message


def test_the_metrics_port_may_equal_the_unused_broker_port() -> None:
    config = load(
        {
            "KAFSCALE_BROKER_PORT": "9100",
            "KAFSCALE_METRICS_PORT": "9100",
            "KAFSCALE_LISTENERS": "PLAINTEXT://:9092",
        }
    )
    assert config.metrics_port == 9100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SCRAM-SHA-512,SCRAM-SHA-256", ("SCRAM-SHA-512", "SCRAM-SHA-256")),
        (" plain ,scram-sha-256, PLAIN", ("PLAIN", "SCRAM-SHA-256")),
        ("SCRAM-SHA-256", ("SCRAM-SHA-256",)),
    ],
)
def test_sasl_enabled_mechanisms(text: str, expected: tuple[str, ...]) -> None:
    assert load({"KAFSCALE_SASL_ENABLED_MECHANISMS": text}).sasl_enabled_mechanisms == expected


def test_sasl_enabled_mechanisms_default() -> None:
    assert load({}).sasl_enabled_mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("SCRAM-SHA-512,GSSAPI", "GSSAPI"),
        ("OAUTHBEARER", "OAUTHBEARER"),
        ("SCRAM-SHA-1", "SCRAM-SHA-1"),
        ("", "at least one"),
        (" , ", "at least one"),
    ],
)
def test_an_unknown_sasl_mechanism_is_refused(text: str, named: str) -> None:
    message = refused({"KAFSCALE_SASL_ENABLED_MECHANISMS": text})
    assert "KAFSCALE_SASL_ENABLED_MECHANISMS" in message and named in message


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({"KAFSCALE_SASL_ADMIN_USER": "admin"}, id="user without password"),
        pytest.param({"KAFSCALE_SASL_ADMIN_PASSWORD": "s3cret-pw"}, id="password without user"),
        pytest.param(
            {"KAFSCALE_SASL_ADMIN_USER": "  ", "KAFSCALE_SASL_ADMIN_PASSWORD": "s3cret-pw"},
            id="blank user",
        ),
    ],
)
def test_the_admin_user_and_password_go_together(environ: dict[str, str]) -> None:
    message = refused(environ)
    assert "KAFSCALE_SASL_ADMIN_USER" in message and "KAFSCALE_SASL_ADMIN_PASSWORD" in message
    assert "s3cret-pw" not in message


@pytest.mark.parametrize("user", ["two words", "tab\tuser", "u" * 257])
def test_an_admin_user_name_kafka_could_not_use_is_refused(user: str) -> None:
    message = refused({"KAFSCALE_SASL_ADMIN_USER": user, "KAFSCALE_SASL_ADMIN_PASSWORD": "pw"})
    assert "KAFSCALE_SASL_ADMIN_USER" in message


def test_the_admin_user_and_password_from_the_environment() -> None:
    config = load({"KAFSCALE_SASL_ADMIN_USER": " admin ", "KAFSCALE_SASL_ADMIN_PASSWORD": "pw-1"})
    assert (config.sasl_admin_user, config.sasl_admin_password) == ("admin", "pw-1")
    assert "pw-1" not in repr(config)
    assert config.public_dict()["sasl_admin_password"] == "***"
    assert "pw-1" in config.secret_values()


def test_the_admin_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "admin-password"
    secret.write_text("from-a-file\n", encoding="utf-8")
    config = load(
        {"KAFSCALE_SASL_ADMIN_USER": "admin", "KAFSCALE_SASL_ADMIN_PASSWORD_FILE": str(secret)}
    )
    assert config.sasl_admin_password == "from-a-file"
    assert "from-a-file" not in repr(config)
    both = {
        "KAFSCALE_SASL_ADMIN_USER": "admin",
        "KAFSCALE_SASL_ADMIN_PASSWORD": "pw",
        "KAFSCALE_SASL_ADMIN_PASSWORD_FILE": str(secret),
    }
    assert "both set" in refused(both)
    missing = {
        "KAFSCALE_SASL_ADMIN_USER": "admin",
        "KAFSCALE_SASL_ADMIN_PASSWORD_FILE": str(tmp_path / "absent"),
    }
    assert "KAFSCALE_SASL_ADMIN_PASSWORD_FILE" in refused(missing)


def test_the_admin_password_is_not_a_flag() -> None:
    with pytest.raises(ConfigError, match="KAFSCALE_SASL_ADMIN_PASSWORD"):
        load({"KAFSCALE_SASL_ADMIN_USER": "admin"}, {"sasl_admin_password": "pw"})


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"KAFSCALE_LISTENERS": "garbage"}, "'garbage' is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://9092"}, "is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT//:9092"}, "is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAIN TEXT://:9092"}, "is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://host:port"}, "is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://::1:9092"}, "is not NAME://host:port"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://:70000"}, "out of range"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://:0"}, "out of range"),
        ({"KAFSCALE_LISTENERS": " , "}, "no listener"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://:9092,plaintext://:9094"}, "named twice"),
        ({"KAFSCALE_LISTENERS": "PLAINTEXT://a:9092,SASL_PLAINTEXT://b:9092"}, "used twice"),
        ({"KAFSCALE_LISTENERS": "INTERNAL://:9092"}, "INTERNAL is not a security protocol"),
        (
            {
                "KAFSCALE_LISTENERS": "A://:9092,B://:9094",
                "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "A:PLAINTEXT",
            },
            "no protocol for B",
        ),
        (
            {
                "KAFSCALE_LISTENERS": "A://:9092",
                "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "A:TLS",
            },
            "'TLS' is not one of",
        ),
        (
            {"KAFSCALE_LISTENERS": "A://:9092", "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "A"},
            "is not NAME:PROTOCOL",
        ),
        (
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092",
                "KAFSCALE_ADVERTISED_LISTENERS": "EXTERNAL://kafka.example:9094",
            },
            "EXTERNAL is not in KAFSCALE_LISTENERS",
        ),
        (
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092",
                "KAFSCALE_ADVERTISED_LISTENERS": "PLAINTEXT://0.0.0.0:9092",
            },
            "not an address a client can connect to",
        ),
        (
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092",
                "KAFSCALE_ADVERTISED_LISTENERS": "PLAINTEXT://:9092",
            },
            "not an address a client can connect to",
        ),
        (
            {
                "KAFSCALE_LISTENERS": "PLAINTEXT://:9092",
                "KAFSCALE_ADVERTISED_LISTENERS": "bogus",
            },
            "KAFSCALE_ADVERTISED_LISTENERS",
        ),
    ],
)
def test_a_bad_listener_setting_is_a_config_error(environ: dict[str, str], named: str) -> None:
    try:
        load(environ)
    except ConfigError as exc:
        assert named in str(exc)
        assert "KAFSCALE_" in str(exc) or "listener" in str(exc)
    except ValueError as exc:  # ConfigError is a ValueError: catch the bare one after it
        pytest.fail(f"a bare {type(exc).__name__} escaped: {exc}")
    else:
        pytest.fail("accepted")


# -- BrokerRecord listeners --------------------------------------------------------------------

OLD_JSON = b'{"node_id":4,"host":"10.0.0.4","port":9092,"rack":"r1","run_id":"x","ready":true}'


def test_an_old_registration_decodes_and_answers_for_plaintext_only() -> None:
    record = records.decode_broker(OLD_JSON)
    assert record == BrokerRecord(node_id=4, host="10.0.0.4", port=9092, rack="r1", run_id="x")
    assert record.listeners == {}
    assert record.endpoint("PLAINTEXT") == ("10.0.0.4", 9092)
    for other in ("SASL_SSL", "INTERNAL", "plaintext", ""):
        assert record.endpoint(other) is None


def test_the_oldest_registration_decodes() -> None:
    record = records.decode_broker(b'{"node_id":0,"host":"h","port":1}')
    assert record.endpoint("PLAINTEXT") == ("h", 1)
    assert (record.draining, record.ready, record.listeners) == (False, True, {})


def test_a_new_registration_answers_per_listener() -> None:
    record = BrokerRecord(
        node_id=3,
        host="kafka-0.internal",
        port=9092,
        listeners={"INTERNAL": ("kafka-0.internal", 9092), "EXTERNAL": ("kafka.example", 19094)},
    )
    decoded = records.decode_broker(records.encode(record))
    assert decoded == record
    assert decoded.endpoint("INTERNAL") == ("kafka-0.internal", 9092)
    assert decoded.endpoint("EXTERNAL") == ("kafka.example", 19094)
    # Its primary host:port is INTERNAL's, not a PLAINTEXT listener it does not have.
    assert decoded.endpoint("PLAINTEXT") is None
    assert decoded.endpoint("SASL_SSL") is None


def test_a_registration_built_from_the_configuration_has_every_advertised_listener() -> None:
    config = load(
        {
            "KAFSCALE_LISTENERS": "PLAINTEXT://:9092,SASL_SSL://:9095",
            "KAFSCALE_ADVERTISED_LISTENERS": "SASL_SSL://public.example:443",
            "KAFSCALE_ADVERTISED_HOST": "kafka-1.internal",
            **TLS_FILES,
        }
    )
    listeners = {x.name: (x.advertised_host, x.advertised_port) for x in config.kafka_listeners}
    record = records.decode_broker(
        records.encode(
            BrokerRecord(node_id=1, host="kafka-1.internal", port=9092, listeners=listeners)
        )
    )
    assert record.endpoint("PLAINTEXT") == ("kafka-1.internal", 9092)
    assert record.endpoint("SASL_SSL") == ("public.example", 443)
