"""DescribeConfigs tells a Kafka client nothing secret: credentials are sensitive (value null, as
Kafka describes a password config) and the broker's backends and operator port are not described
at all (``kafscale.frontend.configs``' rule), whichever way the client asks."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kafscale.config import SETTINGS
from kafscale.frontend.configs import broker_configs, setting_name, topic_configs_of
from kafscale.metadata import topic_configs
from kafscale.protocol.configs import ConfigSource, ConfigType, ResourceType
from kafscale.protocol.errors import ErrorCode
from tests.unit.frontend.test_admin_requests import admin_broker, call, describe_request

CREDENTIALS = {
    "KAFSCALE_S3_ACCESS_KEY": "AKIAIOSFODNN7EXAMPLE",
    "KAFSCALE_S3_SECRET_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "KAFSCALE_ADMIN_TOKEN": "admin-token-0123456789",
    "KAFSCALE_ETCD_KEY": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBexample\n-----END PRIVATE KEY-----",
    "KAFSCALE_ETCD_PASSWORD": "etcd-password-example",
    "KAFSCALE_SSL_KEY_PASSWORD": "tls-key-password-example",
    "KAFSCALE_SASL_ADMIN_PASSWORD": "admin-password-example",
    "KAFSCALE_METRICS_PASSWORD": "metrics-password-example",
}
LOCATIONS = {
    "KAFSCALE_S3_BUCKET": "bucket-of-record",
    "KAFSCALE_SASL_ADMIN_USER": "admin-of-record",
    "KAFSCALE_METRICS_USERNAME": "scraper-of-record",
    "KAFSCALE_S3_ENDPOINT": "http://minio.internal.example:9000",
    "KAFSCALE_S3_REGION": "eu-hidden-1",
    "KAFSCALE_S3_PATH_STYLE": "true",
    "KAFSCALE_S3_NAMESPACE": "tenant-namespace",
    "KAFSCALE_DATA_DIR": "/srv/hidden-data-dir",
    "KAFSCALE_ETCD_ENDPOINTS": "etcd.internal.example:2379",
    "KAFSCALE_ETCD_CA_FILE": "/etc/hidden-ca.pem",
    "KAFSCALE_ETCD_CERT_FILE": "/etc/hidden-client.pem",
    "KAFSCALE_ETCD_USERNAME": "hidden-etcd-user",
    "KAFSCALE_METRICS_PORT": "19193",
}
SENSITIVE = {
    "kafscale.s3.access.key",
    "kafscale.s3.secret.key",
    "kafscale.admin.token",
    "kafscale.etcd.key",
    "kafscale.etcd.password",
    "ssl.key.password",
    "kafscale.sasl.admin.password",
    "kafscale.metrics.password",
}
HIDDEN = {
    "kafscale.s3.bucket",
    "kafscale.s3.endpoint",
    "kafscale.s3.ca.file",
    "kafscale.s3.require.tls",
    "kafscale.s3.region",
    "kafscale.s3.path.style",
    "kafscale.s3.namespace",
    "kafscale.data.dir",
    "kafscale.etcd.endpoints",
    "kafscale.etcd.ca.file",
    "kafscale.etcd.cert.file",
    "kafscale.etcd.username",
    "kafscale.metrics.port",
    "kafscale.sasl.admin.user",
    "kafscale.metrics.tls.cert.file",
    "kafscale.metrics.tls.key.file",
    "kafscale.metrics.username",
    "kafscale.metrics.auth.health",
}
# Pieces of the configured values that no described value may contain.
NEVER_SHOWN = [
    *CREDENTIALS.values(),
    "bucket-of-record",
    "minio.internal.example",
    "eu-hidden-1",
    "tenant-namespace",
    "hidden-data-dir",
    "etcd.internal.example",
    "hidden-ca.pem",
    "hidden-client.pem",
    "hidden-etcd-user",
    "19193",
]


def every_text(configs: Any) -> str:
    """Every value of every config and synonym, one per line."""
    return "\n".join(
        f"{c.name}={c.value}\n" + "\n".join(f"{s.name}={s.value}" for s in c.synonyms)
        for c in configs
    )


def test_the_rule_classifies_the_settings() -> None:
    assert {setting_name(s) for s in SETTINGS if s.secret} == SENSITIVE
    assert {setting_name(s) for s in SETTINGS if s.internal} == HIDDEN
    assert not any(s.secret and s.internal for s in SETTINGS)
    # A topic config's broker synonym is always a config a client may see.
    internal_fields = {s.field for s in SETTINGS if s.internal}
    assert not {c.broker_setting for c in topic_configs.CONFIGS.values()} & internal_fields


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_a_setting_named_like_a_credential_or_a_location_is_classified(setting: Any) -> None:
    """A guard for settings to come (an etcd password, a TLS key file, another endpoint)."""
    credential = re.search(r"key|token|password|secret|credential", setting.field)
    if credential and not setting.field.endswith("_file"):  # a file's path is not its content
        assert setting.secret, f"{setting.env} looks like a credential: mark it secret=True"
    if re.search(r"endpoint|bucket|_dir$|namespace|url", setting.field):
        assert setting.internal, f"{setting.env} locates a backend: mark it internal=True"


@pytest.mark.parametrize("version", range(1, 5))
def test_a_broker_describes_no_credential_and_no_backend(version: int) -> None:
    broker = admin_broker(**CREDENTIALS, **LOCATIONS)
    request = describe_request(
        version, (ResourceType.BROKER, "3", None), synonyms=True, documentation=True
    )
    [result] = call(broker, request, 32).results
    assert result.error_code == ErrorCode.none
    configs = {c.name: c for c in result.configs}
    assert not set(configs) & HIDDEN
    assert "listeners" in configs and "log.segment.bytes" in configs  # the rest is described
    for name in SENSITIVE:
        config = configs[name]
        assert config.value is None and config.is_sensitive and config.read_only
        assert config.config_source == ConfigSource.STATIC_BROKER_CONFIG  # set, not shown
        assert config.synonyms and all(s.value is None for s in config.synonyms)
        if version >= 3:
            assert config.config_type == ConfigType.PASSWORD
    assert [c.name for c in result.configs if c.is_sensitive] == sorted(SENSITIVE)
    text = every_text(result.configs)
    for piece in NEVER_SHOWN:
        assert piece not in text


def test_asking_for_a_hidden_config_by_name_gets_nothing() -> None:
    broker = admin_broker(**CREDENTIALS, **LOCATIONS)
    request = describe_request(
        4, (ResourceType.BROKER, "3", (*sorted(HIDDEN), "kafscale.s3.secret.key")), synonyms=True
    )
    [result] = call(broker, request, 32).results
    [secret] = result.configs
    assert secret.name == "kafscale.s3.secret.key"
    assert secret.value is None and secret.is_sensitive


def test_topic_configs_and_their_synonyms_name_no_backend() -> None:
    broker = admin_broker(**CREDENTIALS, **LOCATIONS)
    request = describe_request(4, (ResourceType.TOPIC, "orders", None), synonyms=True)
    [result] = call(broker, request, 32).results
    assert result.error_code == ErrorCode.none and result.configs
    assert not any(c.is_sensitive for c in result.configs)
    text = every_text(result.configs)
    for piece in NEVER_SHOWN:
        assert piece not in text


def test_unset_credentials_are_still_sensitive_defaults() -> None:
    [*_, secret] = [c for c in broker_configs(admin_broker().config) if c.sensitive]
    assert (secret.value, secret.source) == (None, ConfigSource.DEFAULT_CONFIG)
    assert all(not c.sensitive for c in topic_configs_of({}, admin_broker().config))
