"""Broker configuration: each setting is a ``KAFSCALE_*`` environment variable and a ``serve`` flag.

``kafscale.settings.SETTINGS`` is the single table of what can be configured (re-exported here):
the variable, its default, how its text is parsed and what it means. The CLI builds its flags from
it, the README's configuration table is checked against it by a test, and ``load`` turns
environment + flags into one frozen ``Config``, whose fields are the settings' in table order.
Invalid values raise ``ConfigError`` naming the variable; nothing is silently corrected.

Credentials (``secret`` settings) are the exception: no flag, since a command line is visible to
every user of the machine; they come from the variable or from a file named by ``{variable}_FILE``
(``read_secret``), and no error message, ``repr`` or log line quotes them (``public_dict``,
``secret_values``).
"""

from __future__ import annotations

import dataclasses
import functools
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.security import listeners
from kafscale.security.listeners import Listener, SecurityProtocol
from kafscale.settings import (
    SETTINGS,
    SETTINGS_BY_FIELD,
    GiB,
    MiB,
    Setting,
    UnshowableValue,
    parse_bool,
    parse_size,
)

__all__ = [
    "SETTINGS",
    "SETTINGS_BY_FIELD",
    "Config",
    "ConfigError",
    "GiB",
    "MiB",
    "Setting",
    "flag_refused",
    "load",
    "markdown_table",
    "parse_bool",
    "parse_size",
    "read_secret",
    "unknown_variables",
]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the variable."""


@dataclass(frozen=True)
class Config:
    broker_host: str
    broker_port: int
    advertised_host: str
    max_connections: int
    max_connections_per_ip: int
    max_connections_per_ip_overrides: tuple[tuple[str, int], ...]
    connections_max_idle_ms: int
    connection_max_in_flight_requests: int
    connection_max_in_flight_bytes: int
    listeners: str
    advertised_listeners: str
    listener_security_protocol_map: str
    ssl_cert_file: str
    ssl_key_file: str
    ssl_key_password: str = dataclasses.field(repr=False)
    ssl_ca_file: str
    ssl_client_auth: str
    ssl_reload_interval_ms: int
    sasl_enabled_mechanisms: tuple[str, ...]
    connections_max_reauth_ms: int
    sasl_admin_user: str
    sasl_admin_password: str = dataclasses.field(repr=False)
    authorizer: str
    super_users: tuple[str, ...]
    allow_everyone_if_no_acl_found: bool
    metrics_port: int
    admin_token: str = dataclasses.field(repr=False)
    metrics_tls_cert_file: str
    metrics_tls_key_file: str
    metrics_username: str
    metrics_password: str = dataclasses.field(repr=False)
    metrics_auth_health: bool
    broker_id: int
    store_lock_ttl_ms: int
    data_dir: str
    s3_bucket: str
    s3_region: str
    s3_endpoint: str
    s3_ca_file: str
    s3_require_tls: bool
    s3_path_style: bool
    s3_namespace: str
    s3_access_key: str = dataclasses.field(repr=False)
    s3_secret_key: str = dataclasses.field(repr=False)
    etcd_endpoints: tuple[str, ...]
    etcd_ca_file: str
    etcd_cert_file: str
    etcd_key: str = dataclasses.field(repr=False)
    etcd_username: str
    etcd_password: str = dataclasses.field(repr=False)
    segment_bytes: int
    flush_interval_ms: int  # 0: auto (``flush_interval``)
    group_commit_ms: int
    object_bytes: int
    max_uploads_in_flight: int
    compaction_buffer_bytes: int
    compaction_max_age_ms: int
    cleaner_enable: bool
    cleaner_backoff_ms: int
    cleaner_buffer_bytes: int
    metadata_max_txn_ops: int
    metadata_max_txn_bytes: int
    metadata_compaction_interval_ms: int
    cache_size: int
    index_cache_size: int
    readahead_segments: int
    compression_codec: str
    max_decompression_factor: int
    auto_create_topics: bool
    auto_create_partitions: int
    retention_check_interval_ms: int
    group_initial_rebalance_delay_ms: int
    offsets_topic_partitions: int
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_consumer_session_timeout_ms: int
    group_consumer_heartbeat_interval_ms: int
    group_consumer_max_size: int
    group_consumer_migration_policy: str
    fetch_unflushed: bool
    buffer_bytes: int
    s3_latency_threshold_ms: int
    max_request_bytes: int
    max_decoded_request_bytes: int
    max_request_elements: int
    shards: int
    log_level: str
    boot_timeout_ms: int
    child_hang_timeout_ms: int
    s3_timeout_ms: int
    etcd_timeout_ms: int

    @property
    def advertised_listener_host(self) -> str:
        """The host clients are told to connect to (a wildcard bind is not connectable)."""
        host = self.advertised_host or self.broker_host
        if host in ("", "0.0.0.0", "::"):
            return socket.getfqdn()
        return host

    @functools.cached_property
    def kafka_listeners(self) -> tuple[Listener, ...]:
        """The Kafka listeners (``KAFSCALE_LISTENERS`` and its companions, else one PLAINTEXT
        listener at KAFSCALE_BROKER_HOST:KAFSCALE_BROKER_PORT); checked by ``load``."""
        if not self.listeners:
            return (
                Listener(
                    "PLAINTEXT",
                    SecurityProtocol.PLAINTEXT,
                    self.broker_host,
                    self.broker_port,
                    self.advertised_listener_host,
                    self.broker_port,
                ),
            )
        return listeners.parse(
            self.listeners,
            self.advertised_listeners,
            self.listener_security_protocol_map,
            self.advertised_listener_host,
        )

    @property
    def primary_listener(self) -> Listener:
        """The first listener: what logs and status lines name as the broker's address."""
        return self.kafka_listeners[0]

    @property
    def uses_s3(self) -> bool:
        return bool(self.s3_bucket)

    @property
    def flush_interval(self) -> int:
        """``flush_interval_ms`` resolved: auto is 250 ms with S3, 50 ms with the local store."""
        if self.flush_interval_ms:
            return self.flush_interval_ms
        return 250 if self.uses_s3 else 50

    @property
    def uses_etcd(self) -> bool:
        return bool(self.etcd_endpoints)

    @property
    def store_lock_ttl_s(self) -> int:
        """``store_lock_ttl_ms`` in whole seconds (rounded up), the granularity of etcd leases."""
        return -(-self.store_lock_ttl_ms // 1000)

    def public_dict(self) -> dict[str, Any]:
        """The effective configuration with secrets masked, for the startup log line."""
        values = dataclasses.asdict(self)
        for setting in SETTINGS:
            if setting.secret and values[setting.field]:
                values[setting.field] = "***"
        return values

    def secret_values(self) -> tuple[str, ...]:
        """The credentials configured (non-empty), for the logs to mask wherever they appear."""
        return tuple(value for s in SETTINGS if s.secret and (value := getattr(self, s.field, "")))

    def to_json_dict(self) -> dict[str, Any]:
        """Every value, secrets included: for the children's config file (mode 0600, in the
        run's private directory), never for a log."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json_dict(cls, values: Mapping[str, Any]) -> Config:
        fixed = dict(values)
        fixed["etcd_endpoints"] = tuple(fixed["etcd_endpoints"])
        fixed["sasl_enabled_mechanisms"] = tuple(fixed["sasl_enabled_mechanisms"])
        fixed["super_users"] = tuple(fixed["super_users"])
        fixed["max_connections_per_ip_overrides"] = tuple(
            (str(address), int(count))
            for address, count in fixed["max_connections_per_ip_overrides"]
        )
        return cls(**fixed)


def load(environ: Mapping[str, str], overrides: Mapping[str, str | None] | None = None) -> Config:
    """Build the configuration from ``KAFSCALE_*`` variables; ``overrides`` (flags) win.

    A secret setting comes from its variable or from the file its ``_FILE`` variable names, never
    from an override. Raises ``ConfigError`` for the first invalid value, naming the variable
    (and never quoting a secret).
    """
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        override = overrides.get(setting.field) if overrides else None
        if setting.secret:
            if override is not None:
                raise ConfigError(flag_refused(setting))
            text, source = read_secret(setting, environ), setting.env
        elif override is not None:
            text, source = str(override), f"{setting.flag} ({setting.env})"
        else:
            text, source = environ.get(setting.env, setting.default), setting.env
        try:
            values[setting.field] = setting.parse(text)
        except ValueError as exc:
            if setting.secret or isinstance(exc, UnshowableValue):
                raise ConfigError(f"invalid {source}: {exc}") from None
            raise ConfigError(f"invalid {source}={text!r}: {exc}") from None
    config = Config(**values)
    _check_consistency(config)
    return config


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``KAFSCALE_*`` variables that configure nothing here: likely typos, logged as warnings
    (not errors, since other KafScale components such as the operator share the prefix)."""
    known = {setting.env for setting in SETTINGS}
    known |= {setting.file_env for setting in SETTINGS if setting.secret}
    return sorted(name for name in environ if name.startswith("KAFSCALE_") and name not in known)


def read_secret(setting: Setting, environ: Mapping[str, str]) -> str:
    """A secret setting's text: its variable, or the content of the file ``{env}_FILE`` names
    (e.g. a mounted Kubernetes Secret; surrounding whitespace such as a final newline is
    dropped). Both set, an unreadable or an empty file: ``ConfigError``."""
    path = environ.get(setting.file_env)
    if path is None:
        return environ.get(setting.env, setting.default)
    if setting.env in environ:
        raise ConfigError(f"{setting.env} and {setting.file_env} are both set: set only one")
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {setting.file_env}={path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{setting.file_env}={path!r} is not UTF-8 text") from None
    if not text:
        raise ConfigError(f"{setting.file_env}={path!r} names an empty file")
    return text


def flag_refused(setting: Setting) -> str:
    """Why a secret given as a flag is refused, and what to use instead."""
    return (
        f"{setting.flag} is not accepted: a command line is visible to every user of the "
        f"machine (ps, /proc). Set {setting.env}, or {setting.file_env} to a file holding it "
        "(and consider the value given exposed)"
    )


def _check_consistency(config: Config) -> None:
    if config.s3_endpoint and not config.s3_bucket:
        raise ConfigError(
            "KAFSCALE_S3_ENDPOINT is set but KAFSCALE_S3_BUCKET is empty: name the bucket to use"
        )
    if config.s3_require_tls and config.s3_endpoint.startswith("http://"):
        raise ConfigError(
            "KAFSCALE_S3_REQUIRE_TLS is set but KAFSCALE_S3_ENDPOINT is http://: use an https:// "
            "endpoint"
        )
    if config.s3_ca_file and not config.s3_bucket:
        raise ConfigError("KAFSCALE_S3_CA_FILE is set but KAFSCALE_S3_BUCKET is empty")
    if bool(config.s3_access_key) != bool(config.s3_secret_key):
        raise ConfigError("KAFSCALE_S3_ACCESS_KEY and KAFSCALE_S3_SECRET_KEY must be set together")
    if bool(config.etcd_cert_file) != bool(config.etcd_key):
        raise ConfigError(
            "KAFSCALE_ETCD_CERT_FILE and KAFSCALE_ETCD_KEY (or KAFSCALE_ETCD_KEY_FILE) must be "
            "set together"
        )
    if bool(config.etcd_username) != bool(config.etcd_password):
        raise ConfigError(
            "KAFSCALE_ETCD_USERNAME and KAFSCALE_ETCD_PASSWORD (or KAFSCALE_ETCD_PASSWORD_FILE) "
            "must be set together"
        )
    etcd_access = config.etcd_ca_file or config.etcd_cert_file or config.etcd_username
    if etcd_access and not config.etcd_endpoints:
        raise ConfigError(
            "etcd TLS or authentication is set but KAFSCALE_ETCD_ENDPOINTS is empty: name the "
            "etcd to use"
        )
    _check_listeners(config)
    if bool(config.metrics_tls_cert_file) != bool(config.metrics_tls_key_file):
        raise ConfigError(
            "KAFSCALE_METRICS_TLS_CERT_FILE and KAFSCALE_METRICS_TLS_KEY_FILE must be set together"
        )
    if bool(config.metrics_username) != bool(config.metrics_password):
        raise ConfigError(
            "KAFSCALE_METRICS_USERNAME and KAFSCALE_METRICS_PASSWORD (or "
            "KAFSCALE_METRICS_PASSWORD_FILE) must be set together"
        )
    if config.metrics_auth_health and not config.metrics_username:
        raise ConfigError("KAFSCALE_METRICS_AUTH_HEALTH needs KAFSCALE_METRICS_USERNAME")


def _check_listeners(config: Config) -> None:
    try:
        kafka = config.kafka_listeners
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    port_setting = "KAFSCALE_LISTENERS" if config.listeners else "KAFSCALE_BROKER_PORT"
    if config.metrics_port and config.metrics_port in {listener.port for listener in kafka}:
        raise ConfigError(f"KAFSCALE_METRICS_PORT must differ from the ports of {port_setting}")
    tls = any(listener.protocol.tls for listener in kafka)
    if tls and not (config.ssl_cert_file and config.ssl_key_file):
        raise ConfigError(
            "an SSL or SASL_SSL listener needs KAFSCALE_SSL_CERT_FILE and KAFSCALE_SSL_KEY_FILE"
        )
    if config.ssl_client_auth != "none" and not config.ssl_ca_file:
        raise ConfigError(
            f"KAFSCALE_SSL_CLIENT_AUTH={config.ssl_client_auth} needs KAFSCALE_SSL_CA_FILE (the "
            "CAs client certificates are checked against)"
        )
    if bool(config.sasl_admin_user) != bool(config.sasl_admin_password):
        raise ConfigError(
            "KAFSCALE_SASL_ADMIN_USER and KAFSCALE_SASL_ADMIN_PASSWORD (or "
            "KAFSCALE_SASL_ADMIN_PASSWORD_FILE) must be set together"
        )


def markdown_table() -> str:
    """The configuration table of README.md (a test keeps the two identical)."""
    rows = ["| Variable | Flag | Default | Description |", "|---|---|---|---|"]
    for setting in SETTINGS:
        default = "CPU count" if setting.field == "shards" else (setting.default or "(empty)")
        flag = f"none; or `{setting.file_env}`" if setting.secret else f"`{setting.flag}`"
        rows.append(f"| `{setting.env}` | {flag} | `{default}` | {setting.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
