"""The console's settings, from ``KAFSCALE_CONSOLE_*`` and ``KAFSCALE_UI_*`` variables
(docs/console.md, "Settings"). Pure: an environment in, `ConsoleSettings` or a ``ValueError``
naming the variable out. A secret comes from its variable or from the file its ``_FILE``
variable names (a mounted Secret), never from a flag."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

AUTH_MODES = ("basic", "sasl")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ConsoleSetting:
    env: str
    default: str
    help: str
    secret: bool = False


SETTINGS: tuple[ConsoleSetting, ...] = (
    ConsoleSetting("KAFSCALE_CONSOLE_HOST", "0.0.0.0", "Address the console listens on"),
    ConsoleSetting("KAFSCALE_CONSOLE_PORT", "8088", "Port of the console's web UI"),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_BOOTSTRAP", "localhost:9092", "host:port of a broker to talk Kafka to"
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_AUTH",
        "basic",
        "How users log in: basic (KAFSCALE_UI_USERNAME/PASSWORD) or sasl (their own SASL "
        "credentials, checked by the brokers; each user's ACLs apply)",
    ),
    ConsoleSetting(
        "KAFSCALE_UI_USERNAME", "", "The console's user name (auth basic; required there)"
    ),
    ConsoleSetting(
        "KAFSCALE_UI_PASSWORD",
        "",
        "The console's password (auth basic; required there)",
        secret=True,
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "Security protocol of the console's Kafka connection: PLAINTEXT, SSL, SASL_PLAINTEXT "
        "or SASL_SSL (auth sasl: a SASL_ one)",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SASL_MECHANISM",
        "SCRAM-SHA-512",
        "SASL mechanism of the console's Kafka connection: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SASL_USERNAME", "", "SASL user of the console (auth basic over SASL)"
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SASL_PASSWORD",
        "",
        "SASL password of the console (auth basic over SASL)",
        secret=True,
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SSL_CA_FILE", "", "PEM CA bundle to trust for the brokers' TLS"
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_TIMEOUT_SECONDS",
        "15",
        "Seconds a Kafka call of the console may take before the page says it failed",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_METRICS_URLS",
        "",
        "The brokers' /metrics URLs, comma-separated; {host} in one is replaced by each "
        "registered broker's host (e.g. http://{host}:9093/metrics); empty: no charts",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_METRICS_USERNAME", "", "HTTP basic user for the brokers' /metrics"
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_METRICS_PASSWORD",
        "",
        "HTTP basic password for the brokers' /metrics",
        secret=True,
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SAMPLE_SECONDS",
        "5",
        "Seconds between samples of the brokers' metrics and of the storage summary",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_METADATA",
        "auto",
        "Read the metadata store (the brokers' KAFSCALE_ETCD_* / KAFSCALE_DATA_DIR) for "
        "storage columns: on, off, or auto (on when KAFSCALE_ETCD_ENDPOINTS or "
        "KAFSCALE_DATA_DIR is set)",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SESSION_IDLE_SECONDS",
        "3600",
        "A session not used for this long is logged out",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SESSION_MAX_SECONDS",
        "43200",
        "A session ends this long after its login, used or not",
    ),
    ConsoleSetting(
        "KAFSCALE_CONSOLE_SECURE_COOKIES",
        "false",
        "Mark the session cookie Secure (the console is reached over HTTPS, e.g. behind an "
        "ingress)",
    ),
)

_BY_ENV = {s.env: s for s in SETTINGS}


@dataclass(frozen=True)
class ConsoleSettings:
    host: str
    port: int
    bootstrap: str
    auth: str
    ui_username: str
    ui_password: str = field(repr=False)
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_ca_file: str = ""
    timeout: float = 15.0
    metrics_urls: tuple[str, ...] = ()
    metrics_username: str = ""
    metrics_password: str = field(default="", repr=False)
    sample_seconds: float = 5.0
    metadata: bool = False
    session_idle: float = 3600.0
    session_max: float = 43200.0
    secure_cookies: bool = False


def _get(environ: Mapping[str, str], env: str) -> str:
    setting = _BY_ENV[env]
    if setting.secret:
        path = environ.get(f"{env}_FILE", "").strip()
        if path:
            if environ.get(env):
                raise ValueError(f"{env} and {env}_FILE are both set: set only one")
            try:
                with open(path, encoding="utf-8") as file:
                    return file.read().strip()
            except OSError as exc:
                raise ValueError(f"cannot read {env}_FILE={path!r}: {exc.strerror}") from None
    return environ.get(env, setting.default).strip()


def _number(environ: Mapping[str, str], env: str, low: float, high: float) -> float:
    text = _get(environ, env)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{env}: {text!r} is not a number") from None
    if not low <= value <= high:
        raise ValueError(f"{env}: {text} is not between {low:g} and {high:g}")
    return value


def _choice(environ: Mapping[str, str], env: str, choices: tuple[str, ...]) -> str:
    text = _get(environ, env)
    for choice in choices:
        if text.lower() == choice.lower():
            return choice
    raise ValueError(f"{env}: {text!r} is not one of {', '.join(choices)}")


def _flag(environ: Mapping[str, str], env: str) -> bool:
    text = _get(environ, env).lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"{env}: {text!r} is not true or false")


def load(environ: Mapping[str, str]) -> ConsoleSettings:
    auth = _choice(environ, "KAFSCALE_CONSOLE_AUTH", AUTH_MODES)
    protocol = _choice(environ, "KAFSCALE_CONSOLE_SECURITY_PROTOCOL", PROTOCOLS)
    username = _get(environ, "KAFSCALE_UI_USERNAME")
    password = _get(environ, "KAFSCALE_UI_PASSWORD")
    if auth == "basic" and not (username and password):
        missing = [
            env
            for env, value in (
                ("KAFSCALE_UI_USERNAME", username),
                ("KAFSCALE_UI_PASSWORD", password),
            )
            if not value
        ]
        raise ValueError(
            f"{' and '.join(missing)} not set: the console has no default login. Set both (or "
            "KAFSCALE_UI_PASSWORD_FILE), or KAFSCALE_CONSOLE_AUTH=sasl to log in with SASL "
            "credentials"
        )
    if auth == "sasl" and not protocol.startswith("SASL_"):
        raise ValueError(
            "KAFSCALE_CONSOLE_AUTH=sasl needs KAFSCALE_CONSOLE_SECURITY_PROTOCOL SASL_SSL or "
            f"SASL_PLAINTEXT (it is {protocol}): the brokers check each user's credentials"
        )
    sasl_username = _get(environ, "KAFSCALE_CONSOLE_SASL_USERNAME")
    sasl_password = _get(environ, "KAFSCALE_CONSOLE_SASL_PASSWORD")
    if auth == "basic" and protocol.startswith("SASL_") and not (sasl_username and sasl_password):
        raise ValueError(
            f"KAFSCALE_CONSOLE_SECURITY_PROTOCOL={protocol} needs KAFSCALE_CONSOLE_SASL_USERNAME "
            "and KAFSCALE_CONSOLE_SASL_PASSWORD (the console's own Kafka login)"
        )
    bootstrap = _get(environ, "KAFSCALE_CONSOLE_BOOTSTRAP")
    if not bootstrap or ":" not in bootstrap:
        raise ValueError(f"KAFSCALE_CONSOLE_BOOTSTRAP: {bootstrap!r} is not host:port")
    metadata = _choice(environ, "KAFSCALE_CONSOLE_METADATA", ("on", "off", "auto"))
    urls = tuple(u.strip() for u in _get(environ, "KAFSCALE_CONSOLE_METRICS_URLS").split(","))
    for url in urls:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"KAFSCALE_CONSOLE_METRICS_URLS: {url!r} is not an http(s) URL")
    return ConsoleSettings(
        host=_get(environ, "KAFSCALE_CONSOLE_HOST"),
        port=int(_number(environ, "KAFSCALE_CONSOLE_PORT", 0, 65535)),
        bootstrap=bootstrap,
        auth=auth,
        ui_username=username,
        ui_password=password,
        security_protocol=protocol,
        sasl_mechanism=_choice(environ, "KAFSCALE_CONSOLE_SASL_MECHANISM", SASL_MECHANISMS),
        sasl_username=sasl_username,
        sasl_password=sasl_password,
        ssl_ca_file=_get(environ, "KAFSCALE_CONSOLE_SSL_CA_FILE"),
        timeout=_number(environ, "KAFSCALE_CONSOLE_TIMEOUT_SECONDS", 1, 600),
        metrics_urls=tuple(u for u in urls if u),
        metrics_username=_get(environ, "KAFSCALE_CONSOLE_METRICS_USERNAME"),
        metrics_password=_get(environ, "KAFSCALE_CONSOLE_METRICS_PASSWORD"),
        sample_seconds=_number(environ, "KAFSCALE_CONSOLE_SAMPLE_SECONDS", 0.1, 3600),
        metadata=metadata == "on"
        or (
            metadata == "auto"
            and bool(environ.get("KAFSCALE_ETCD_ENDPOINTS") or environ.get("KAFSCALE_DATA_DIR"))
        ),
        session_idle=_number(environ, "KAFSCALE_CONSOLE_SESSION_IDLE_SECONDS", 60, 86400 * 30),
        session_max=_number(environ, "KAFSCALE_CONSOLE_SESSION_MAX_SECONDS", 60, 86400 * 365),
        secure_cookies=_flag(environ, "KAFSCALE_CONSOLE_SECURE_COOKIES"),
    )
