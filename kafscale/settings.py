"""What can be configured: ``SETTINGS``, one ``Setting`` per ``KAFSCALE_*`` variable, and the
parsers that turn a variable's text into its value.

Each setting names its field of ``kafscale.config.Config``, its default (as text, parsed like any
value), its parser, its help text (the README's table and ``serve --help``) and whether it is a
credential (``secret``) or says where the broker's state lives (``internal``). A parser raises
``ValueError`` with a message saying what was expected; ``UnshowableValue`` when its message must
not be followed by the value (it may hold a credential). Loading the environment, secret files and
the checks between settings are ``kafscale.config``'s.

A new setting goes in ``SETTINGS`` here AND in ``Config`` (``kafscale.config``, same order), AND in
README.md's configuration table (``python -m kafscale.config`` prints it; a test compares them).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024
GiB = 1024 * MiB


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
}


def parse_size(text: str) -> int:
    """Parse a byte size: ``4194304``, ``4MiB``, ``1GB`` (binary units, as the spec's 1GB means)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"expected a byte size such as 4194304 or 4MiB, got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


AUTO_BROKER_ID = -1  # KAFSCALE_BROKER_ID=auto: the supervisor takes the lowest free id


def parse_broker_id(text: str, hostname: str | None = None) -> int:
    """A node id; ``ordinal``: the number after the last ``-`` of the host name (a StatefulSet
    pod ``kafscale-2`` is broker 2); ``auto``: ``AUTO_BROKER_ID``."""
    word = text.strip().lower()
    if word == "auto":
        return AUTO_BROKER_ID
    if word == "ordinal":
        host = hostname if hostname is not None else socket.gethostname()
        _, _, ordinal = host.split(".")[0].rpartition("-")
        if not ordinal.isdigit():
            raise ValueError(
                f"ordinal: the host name {host!r} does not end in -<number> (a StatefulSet pod's)"
            )
        text = ordinal
    try:
        return _int_in(0, 2**31 - 1)(text)
    except ValueError as exc:
        raise ValueError(f"expected a node id, ordinal or auto: {exc}") from None


def _auto_or(parse: Callable[[str], int]) -> Callable[[str], int]:
    """``auto`` (0: the broker picks by backend) or what ``parse`` takes."""

    def parse_auto(text: str) -> int:
        return 0 if text.strip().lower() == "auto" else parse(text)

    return parse_auto


def _size_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = parse_size(text)
        if value < low:
            raise ValueError(f"must be at least {low} bytes, got {value}")
        return value

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _text(text: str) -> str:
    return text.strip()


def _endpoints(text: str) -> tuple[str, ...]:
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    for endpoint in endpoints:
        if "@" in endpoint:  # user:password@host: the error must not echo it
            raise UnshowableValue(
                "credentials in an endpoint are not accepted: set KAFSCALE_ETCD_USERNAME and "
                "KAFSCALE_ETCD_PASSWORD (or KAFSCALE_ETCD_PASSWORD_FILE); give "
                "host:port[,host:port...]"
            )
        if not re.fullmatch(r"(https?://)?[\w.\-\[\]:]+:\d+", endpoint):
            raise ValueError(f"expected host:port[,host:port...], got {endpoint!r}")
    return endpoints


def _pem_private_key(text: str) -> str:
    value = text.strip()
    if value and not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", value):
        raise UnshowableValue("expected a PEM private key (-----BEGIN ... PRIVATE KEY-----)")
    return value


class UnshowableValue(ValueError):
    """A parse error whose value must not be echoed (it holds a credential)."""


def _http_url(text: str) -> str:
    value = text.strip()
    if "@" in urllib.parse.urlsplit(value).netloc:
        raise UnshowableValue(
            "credentials in the URL are not accepted: set KAFSCALE_S3_ACCESS_KEY and "
            "KAFSCALE_S3_SECRET_KEY (or their _FILE variables) instead"
        )
    if value and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return value


def _admin_token(text: str) -> str:
    value = text.strip()
    if value and (len(value) < 16 or any(char.isspace() for char in value)):
        raise ValueError("must be at least 16 characters without spaces (or empty: disabled)")
    return value


def _namespace(text: str) -> str:
    value = text.strip()
    if not re.fullmatch(r"[A-Za-z0-9._\-]+", value):
        raise ValueError(f"expected letters, digits, '.', '_' or '-', got {text!r}")
    return value


def _address_limits(text: str) -> tuple[tuple[str, int], ...]:
    """``ip:count[,ip:count...]`` (Kafka's max.connections.per.ip.overrides, IP addresses only;
    an IPv6 address may be bracketed: ``[::1]:50``)."""
    limits: dict[str, int] = {}
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        host, _, count = part.rpartition(":")
        try:
            address = ipaddress.ip_address(host.strip().removeprefix("[").removesuffix("]"))
            limit = int(count)
        except ValueError:
            raise ValueError(f"expected ip:count[,ip:count...], got {part!r}") from None
        if limit < 0:
            raise ValueError(f"a connection count cannot be negative, got {part!r}")
        limits[str(address)] = limit
    return tuple(limits.items())


SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def _sasl_mechanisms(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip().upper() for p in text.split(",") if p.strip()))
    for name in names:
        if name not in SASL_MECHANISMS:
            raise ValueError(f"{name} is not one of {', '.join(SASL_MECHANISMS)}")
    if not names:
        raise ValueError(f"name at least one of {', '.join(SASL_MECHANISMS)}")
    return names


def _principals(text: str) -> tuple[str, ...]:
    principals = tuple(dict.fromkeys(p.strip() for p in text.split(";") if p.strip()))
    for principal in principals:
        kind, _, name = principal.partition(":")
        if not kind or not name:
            raise ValueError(f"{principal!r} is not Type:name (User:admin)")
    return principals


def _user_name(text: str) -> str:
    value = text.strip()
    if value and (len(value) > 256 or any(c.isspace() for c in value)):
        raise ValueError("a user name of at most 256 characters, without spaces")
    return value


def _idle_ms(text: str) -> int:
    value = int(text.strip())
    if value != -1 and not 1 <= value <= 2**31 - 1:
        raise ValueError(f"must be -1 (never) or between 1 and {2**31 - 1}, got {value}")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting. ``secret``: a credential -- read from the environment or from the file named
    by ``{env}_FILE``, never from a flag (a command line is visible to every user of the machine);
    masked in logs; described to Kafka clients as sensitive (value null). ``internal``: where the
    broker's state lives or how its backends and operators reach it -- never described to Kafka
    clients (``kafscale.frontend.configs``)."""

    field: str
    default: str
    parse: Callable[[str], Any]
    help: str
    secret: bool = False
    internal: bool = False

    @property
    def env(self) -> str:
        return "KAFSCALE_" + self.field.upper()

    @property
    def file_env(self) -> str:
        """The variable naming a file that holds a secret setting's value."""
        return self.env + "_FILE"

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "broker_host",
        "127.0.0.1",
        _text,
        "Address the Kafka listener binds to and advertises to clients",
    ),
    Setting("broker_port", "9092", _int_in(0, 65535), "Kafka protocol port"),
    Setting(
        "advertised_host",
        "",
        _text,
        "Host advertised in Metadata responses (default: KAFSCALE_BROKER_HOST; "
        "0.0.0.0 advertises the machine's hostname)",
    ),
    Setting(
        "max_connections",
        "10000",
        _int_in(1, 10_000_000),
        "Client connections the broker keeps open (Kafka's max.connections); at the limit it "
        "stops accepting until one closes",
    ),
    Setting(
        "max_connections_per_ip",
        "1000",
        _int_in(0, 10_000_000),
        "Client connections from one IP address (Kafka's max.connections.per.ip); more are "
        "closed right after accept",
    ),
    Setting(
        "max_connections_per_ip_overrides",
        "",
        _address_limits,
        "Per-address exceptions to KAFSCALE_MAX_CONNECTIONS_PER_IP: ip:count[,ip:count...]",
    ),
    Setting(
        "connections_max_idle_ms",
        "600000",
        _idle_ms,
        "Close a connection with no request in progress that received nothing for this long "
        "(Kafka's connections.max.idle.ms; -1 = never)",
    ),
    Setting(
        "connection_max_in_flight_requests",
        "64",
        _int_in(1, 100_000),
        "Requests of one connection read and not yet answered; past it the broker stops reading "
        "from that connection (TCP back-pressure)",
    ),
    Setting(
        "connection_max_in_flight_bytes",
        "32MiB",
        _size_at_least(1024),
        "Bytes of requests read and of responses not yet sent that one connection may hold; past "
        "it the broker stops reading from that connection (one larger request is still served)",
    ),
    Setting(
        "listeners",
        "",
        _text,
        "Kafka listeners, NAME://host:port[,...] (Kafka's listeners; an empty host binds every "
        "interface); empty = PLAINTEXT://KAFSCALE_BROKER_HOST:KAFSCALE_BROKER_PORT. When set, "
        "KAFSCALE_BROKER_PORT is not used",
    ),
    Setting(
        "advertised_listeners",
        "",
        _text,
        "Where clients are told to reach each listener, NAME://host:port[,...] (Kafka's "
        "advertised.listeners); a listener not named is advertised at its own host:port, or at "
        "KAFSCALE_ADVERTISED_HOST (else KAFSCALE_BROKER_HOST) when it binds every interface",
    ),
    Setting(
        "listener_security_protocol_map",
        "",
        _text,
        "NAME:PROTOCOL[,...], each PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (Kafka's "
        "listener.security.protocol.map); empty = each listener's name is its protocol",
    ),
    Setting(
        "ssl_cert_file",
        "",
        _text,
        "PEM certificate chain the SSL and SASL_SSL listeners present (reloaded on change)",
    ),
    Setting(
        "ssl_key_file",
        "",
        _text,
        "PEM private key of KAFSCALE_SSL_CERT_FILE (reloaded on change)",
    ),
    Setting(
        "ssl_key_password",
        "",
        _text,
        "Password of KAFSCALE_SSL_KEY_FILE when it is encrypted",
        secret=True,
    ),
    Setting(
        "ssl_ca_file",
        "",
        _text,
        "PEM file of the CAs client certificates are checked against (mTLS)",
    ),
    Setting(
        "ssl_client_auth",
        "none",
        _one_of("none", "requested", "required"),
        "Client certificates on SSL and SASL_SSL listeners (Kafka's ssl.client.auth): none, "
        "requested or required; a verified certificate's subject is the principal on SSL",
    ),
    Setting(
        "ssl_reload_interval_ms",
        "60000",
        _int_in(1000, 86_400_000),
        "How often the TLS files are checked for a change; new connections get the new "
        "certificate without a restart",
    ),
    Setting(
        "sasl_enabled_mechanisms",
        "SCRAM-SHA-512,SCRAM-SHA-256",
        _sasl_mechanisms,
        "SASL mechanisms of the SASL listeners: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN (Kafka's "
        "sasl.enabled.mechanisms; PLAIN sends the password itself: use it over TLS)",
    ),
    Setting(
        "connections_max_reauth_ms",
        "0",
        _int_in(0, 2**63 - 1),
        "How long a SASL session lasts before the client must re-authenticate on its connection "
        "(Kafka's connections.max.reauth.ms, KIP-368; 0 = never)",
    ),
    Setting(
        "sasl_admin_user",
        "",
        _user_name,
        "A SCRAM user (SHA-256 and SHA-512) created at start when it does not exist, with "
        "KAFSCALE_SASL_ADMIN_PASSWORD; never overwritten",
        internal=True,
    ),
    Setting(
        "sasl_admin_password",
        "",
        _text,
        "Password of KAFSCALE_SASL_ADMIN_USER when it is created",
        secret=True,
    ),
    Setting(
        "authorizer",
        "none",
        _one_of("none", "acl"),
        "none: every client may do everything; acl: Kafka's ACLs decide (created with "
        "kafka-acls; Kafka's authorizer.class.name)",
    ),
    Setting(
        "super_users",
        "",
        _principals,
        "Principals ACLs do not apply to, ';'-separated: User:admin;User:CN=ops (Kafka's "
        "super.users)",
    ),
    Setting(
        "allow_everyone_if_no_acl_found",
        "false",
        parse_bool,
        "With KAFSCALE_AUTHORIZER=acl, allow what no ACL mentions (Kafka's "
        "allow.everyone.if.no.acl.found); false denies it",
    ),
    Setting(
        "metrics_port",
        "9093",
        _int_in(0, 65535),
        "Port of /metrics, /healthz and /readyz",
        internal=True,
    ),
    Setting(
        "admin_token",
        "",
        _admin_token,
        "Bearer token POST /flush on the metrics port requires (16+ characters); "
        "empty = POST /flush disabled",
        secret=True,
    ),
    Setting(
        "metrics_tls_cert_file",
        "",
        _text,
        "PEM certificate chain: the metrics port serves HTTPS (reloaded on change)",
        internal=True,
    ),
    Setting(
        "metrics_tls_key_file",
        "",
        _text,
        "PEM private key of KAFSCALE_METRICS_TLS_CERT_FILE",
        internal=True,
    ),
    Setting(
        "metrics_username",
        "",
        _text,
        "HTTP basic authentication for /metrics (with KAFSCALE_METRICS_PASSWORD); empty = open",
        internal=True,
    ),
    Setting(
        "metrics_password",
        "",
        _text,
        "Password of KAFSCALE_METRICS_USERNAME",
        secret=True,
    ),
    Setting(
        "metrics_auth_health",
        "false",
        parse_bool,
        "Basic authentication for /healthz and /readyz too (kubelet probes then need it)",
        internal=True,
    ),
    Setting(
        "broker_id",
        "0",
        parse_broker_id,
        "This broker's node id: a number, ordinal (from a StatefulSet pod's host name "
        "kafscale-N) or auto (the lowest id no running broker holds)",
    ),
    Setting(
        "store_lock_ttl_ms",
        "10000",
        _int_in(2000, 300_000),
        "TTL of the broker lease (whole seconds): how long a broker that died or was cut off "
        "keeps its registration, its partitions and (without S3 + etcd) the store lock; "
        "failover takes about this long plus a second",
    ),
    Setting(
        "data_dir",
        "./data",
        _text,
        "Directory of the embedded backends (segments and SQLite metadata)",
        internal=True,
    ),
    Setting(
        "s3_bucket",
        "",
        _text,
        "S3 bucket for segments; empty = store segments under KAFSCALE_DATA_DIR",
        internal=True,
    ),
    Setting("s3_region", "us-east-1", _text, "S3 region", internal=True),
    Setting(
        "s3_endpoint",
        "",
        _http_url,
        "S3-compatible endpoint URL (MinIO, ...); empty = AWS S3",
        internal=True,
    ),
    Setting(
        "s3_ca_file",
        "",
        _text,
        "PEM bundle of the CAs an https S3 endpoint's certificate is checked against (empty = "
        "the system's roots)",
        internal=True,
    ),
    Setting(
        "s3_require_tls",
        "false",
        parse_bool,
        "Refuse to start with an http:// KAFSCALE_S3_ENDPOINT (objects and credentials would "
        "cross the network in clear)",
        internal=True,
    ),
    Setting(
        "s3_path_style",
        "false",
        parse_bool,
        "Use path-style S3 addressing (MinIO needs it)",
        internal=True,
    ),
    Setting(
        "s3_namespace",
        "default",
        _namespace,
        "Key prefix of this cluster in the bucket and in the metadata store",
        internal=True,
    ),
    Setting(
        "s3_access_key",
        "",
        _text,
        "S3 access key id (empty = boto3's default credential chain: AWS_* variables, "
        "profile, web identity, instance role)",
        secret=True,
    ),
    Setting("s3_secret_key", "", _text, "S3 secret access key", secret=True),
    Setting(
        "etcd_endpoints",
        "",
        _endpoints,
        "Comma-separated etcd endpoints: host:port, http://host:port or https://host:port (TLS; "
        "host:port is TLS too when KAFSCALE_ETCD_CA_FILE or KAFSCALE_ETCD_CERT_FILE is set); "
        "calls go to one and move to the next when it fails; empty = SQLite metadata under "
        "KAFSCALE_DATA_DIR",
        internal=True,
    ),
    Setting(
        "etcd_ca_file",
        "",
        _text,
        "PEM file of the CAs etcd's server certificates are checked against (empty = the "
        "system's roots)",
        internal=True,
    ),
    Setting(
        "etcd_cert_file",
        "",
        _text,
        "PEM file of the client certificate presented to etcd (its --client-cert-auth); "
        "with KAFSCALE_ETCD_KEY",
        internal=True,
    ),
    Setting(
        "etcd_key",
        "",
        _pem_private_key,
        "Private key of KAFSCALE_ETCD_CERT_FILE, PEM (usually from the file "
        "KAFSCALE_ETCD_KEY_FILE names)",
        secret=True,
    ),
    Setting(
        "etcd_username",
        "",
        _text,
        "etcd user the broker authenticates as (etcd's auth enable); empty = no authentication",
        internal=True,
    ),
    Setting("etcd_password", "", _text, "Password of KAFSCALE_ETCD_USERNAME", secret=True),
    Setting(
        "segment_bytes",
        "4MiB",
        _size_at_least(1024),
        "Segment size compaction aims at (a topic's segment.bytes overrides it); also the "
        "largest shared-memory buffer of a partition",
    ),
    Setting(
        "flush_interval_ms",
        "auto",
        _auto_or(_int_in(1, 3_600_000)),
        "Upload a write-ahead object this long after its oldest unflushed byte arrived "
        "(auto: 250 with S3, 50 with the local store, where PUTs cost nothing)",
    ),
    Setting(
        "group_commit_ms",
        "5",
        _int_in(0, 60_000),
        "Upload a write-ahead object this long after an acks=all request began to wait",
    ),
    Setting(
        "object_bytes",
        "8MiB",
        _size_at_least(64 * 1024),
        "Upload a write-ahead object once it holds this many bytes",
    ),
    Setting(
        "max_uploads_in_flight",
        "4",
        _int_in(1, 64),
        "Write-ahead objects uploading at once (commits still go in order)",
    ),
    Setting(
        "compaction_buffer_bytes",
        "512MiB",
        _size_at_least(0),
        "Memory for committed chunks not yet compacted into segments (fuller: smaller segments)",
    ),
    Setting(
        "compaction_max_age_ms",
        "10800000",
        _int_in(1000, 7 * 86_400_000),
        "Compact a partition's chunks into a segment once the oldest is this old",
    ),
    Setting(
        "cleaner_enable",
        "true",
        parse_bool,
        "Run the log cleaner on compacted topics (Kafka's log.cleaner.enable)",
    ),
    Setting(
        "cleaner_backoff_ms",
        "15000",
        _int_in(100, 86_400_000),
        "How long the log cleaner waits when no compacted partition is due (Kafka's "
        "log.cleaner.backoff.ms)",
    ),
    Setting(
        "cleaner_buffer_bytes",
        "128MiB",
        _size_at_least(1024 * 1024),
        "Memory for the log cleaner's map of keys to their latest offset (Kafka's "
        "log.cleaner.dedupe.buffer.size)",
    ),
    Setting(
        "metadata_max_txn_ops",
        "128",
        _int_in(8, 100_000),
        "Operations per metadata transaction (etcd's --max-txn-ops)",
    ),
    Setting(
        "metadata_max_txn_bytes",
        "1MiB",
        _size_at_least(64 * 1024),
        "Bytes per metadata transaction (under etcd's --max-request-bytes)",
    ),
    Setting(
        "metadata_compaction_interval_ms",
        "300000",
        _int_in(0, 86_400_000),
        "Forget etcd history older than this, every this often (0: etcd's own "
        "--auto-compaction does it)",
    ),
    Setting("cache_size", "1GiB", _size_at_least(0), "L1 hot segment cache size"),
    Setting("index_cache_size", "256MiB", _size_at_least(0), "L2 index cache size"),
    Setting("readahead_segments", "2", _int_in(0, 64), "Segments to prefetch on sequential reads"),
    Setting(
        "compression_codec",
        "snappy",
        _one_of("none", "snappy", "lz4", "zstd"),
        "Codec applied to batches that arrive uncompressed",
    ),
    Setting(
        "max_decompression_factor",
        "64",
        _int_in(1, 1024),
        "A compressed batch may decompress to at most this many times its topic's "
        "max.message.bytes (MESSAGE_TOO_LARGE beyond)",
    ),
    Setting("auto_create_topics", "true", parse_bool, "Create unknown topics on Metadata/Produce"),
    Setting(
        "auto_create_partitions", "1", _int_in(1, 100_000), "Partitions of an auto-created topic"
    ),
    Setting(
        "retention_check_interval_ms",
        "300000",
        _int_in(100, 86_400_000),
        "How often segments past their topic's retention.ms/retention.bytes are deleted",
    ),
    Setting(
        "group_initial_rebalance_delay_ms",
        "3000",
        _int_in(0, 300_000),
        "How long the first rebalance of an empty group waits for more members",
    ),
    Setting(
        "offsets_topic_partitions",
        "50",
        _int_in(1, 1000),
        "Partitions of __consumer_offsets when it is created (each group's coordinator is the "
        "owner of one); a namespace keeps the count it was created with",
    ),
    Setting(
        "group_min_session_timeout_ms",
        "6000",
        _int_in(1, 3_600_000),
        "Smallest session timeout a consumer may ask for",
    ),
    Setting(
        "group_max_session_timeout_ms",
        "1800000",
        _int_in(1, 3_600_000),
        "Largest session timeout a consumer may ask for",
    ),
    Setting(
        "group_consumer_session_timeout_ms",
        "45000",
        _int_in(1, 3_600_000),
        "Session timeout of members of consumer (KIP-848, group.protocol=consumer) groups: "
        "removed when they do not heartbeat for this long",
    ),
    Setting(
        "group_consumer_heartbeat_interval_ms",
        "5000",
        _int_in(1, 3_600_000),
        "How often members of consumer (KIP-848) groups heartbeat; below the session timeout",
    ),
    Setting(
        "group_consumer_max_size",
        "2147483647",
        _int_in(1, 2_147_483_647),
        "Most members one consumer (KIP-848) group may have (GROUP_MAX_SIZE_REACHED beyond)",
    ),
    Setting(
        "group_consumer_migration_policy",
        "bidirectional",
        _one_of("bidirectional", "upgrade", "downgrade", "disabled"),
        "Online migration of live groups (Kafka's group.consumer.migration.policy): upgrade, a "
        "classic group becomes a consumer (KIP-848) group when a consumer-protocol member joins "
        "(its classic members live on in it); downgrade, a consumer group of classic members "
        "only becomes classic again; bidirectional, both; disabled, neither",
    ),
    Setting(
        "fetch_unflushed",
        "false",
        parse_bool,
        "Let consumers read buffered data not yet committed to S3",
    ),
    Setting(
        "buffer_bytes",
        "512MiB",
        _size_at_least(1024 * 1024),
        "Unflushed bytes the broker may hold (split among shards); beyond it produce is refused "
        "with a retriable error",
    ),
    Setting(
        "s3_latency_threshold_ms",
        "5000",
        _int_in(1, 600_000),
        "An upload slower than this marks S3 degraded: produce is refused until uploads are fast",
    ),
    Setting(
        "max_request_bytes",
        "100MiB",
        _size_at_least(1024),
        "Largest request frame accepted (Kafka's socket.request.max.bytes)",
    ),
    Setting(
        "max_decoded_request_bytes",
        "1MiB",
        _size_at_least(1024),
        "Largest part of a request decoded field by field: a whole request other than Produce, "
        "JoinGroup and SyncGroup; theirs besides record batches and group metadata. Bounds the "
        "memory (~25x) and CPU of decoding one request",
    ),
    Setting(
        "max_request_elements",
        "30000",
        _int_in(100, 10_000_000),
        "Most array elements (topics, partitions, groups, ...) one request may hold: bounds the "
        "event-loop time of handling and answering it (~10 us each at worst)",
    ),
    Setting(
        "shards",
        str(os.cpu_count() or 1),
        _int_in(1, 256),
        "Shard worker processes (default: CPU count)",
    ),
    Setting("log_level", "info", _one_of("debug", "info", "warning", "error"), "Log level"),
    Setting(
        "boot_timeout_ms",
        "15000",
        _int_in(100, 600_000),
        "How long a child process or backend may take to come up before serve fails",
    ),
    Setting(
        "child_hang_timeout_ms",
        "60000",
        _int_in(1000, 3_600_000),
        "A child that answers none of its liveness pings (every 2 s) for this long is killed "
        "and respawned",
    ),
    Setting(
        "s3_timeout_ms",
        "10000",
        _int_in(100, 600_000),
        "Connect and read timeout of one S3 request (tried twice); S3 counts as unavailable "
        "after that",
    ),
    Setting(
        "etcd_timeout_ms",
        "5000",
        _int_in(100, 600_000),
        "Deadline of one etcd call; etcd counts as unavailable after that",
    ),
)

SETTINGS_BY_FIELD = {setting.field: setting for setting in SETTINGS}
