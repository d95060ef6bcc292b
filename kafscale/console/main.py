"""``kafscale console``: load the settings (refusing to start without a login, with the reason),
connect the samplers and serve the web UI until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from aiohttp import web

from kafscale import logs
from kafscale.console.auth import Sessions, Throttle
from kafscale.console.kafka import KafkaAccess
from kafscale.console.metrics import MetricsSampler
from kafscale.console.settings import ConsoleSettings, load
from kafscale.console.storage import StorageView, open_view
from kafscale.console.web import Console, templates
from kafscale.kafka_admin import Connection

log = logging.getLogger("kafscale.console")


def connection(settings: ConsoleSettings, username: str, password: str) -> Connection:
    ca_pem = None
    if settings.ssl_ca_file:
        with open(settings.ssl_ca_file, "rb") as file:
            ca_pem = file.read()
    sasl = settings.security_protocol.startswith("SASL_")
    return Connection(
        bootstrap=settings.bootstrap,
        security_protocol=settings.security_protocol,
        sasl_mechanism=settings.sasl_mechanism if sasl else None,
        username=username if sasl else None,
        password=password if sasl else None,
        ca_pem=ca_pem,
        timeout=settings.timeout,
    )


def metrics_urls(settings: ConsoleSettings, storage: StorageView | None) -> list[str]:
    """The configured URLs, each with {host} expanded to every registered broker's host."""
    urls: list[str] = []
    for url in settings.metrics_urls:
        if "{host}" not in url:
            urls.append(url)
        elif storage is not None:
            hosts = sorted({b.host for b in storage.snapshot().brokers})
            urls.extend(url.replace("{host}", host) for host in hosts)
    return urls


def build(settings: ConsoleSettings, environ: Mapping[str, str]) -> Console:
    storage = open_view(environ, settings.sample_seconds) if settings.metadata else None
    metrics = None
    if settings.metrics_urls:
        auth = None
        if settings.metrics_username:
            auth = (settings.metrics_username, settings.metrics_password)
        metrics = MetricsSampler(
            lambda: metrics_urls(settings, storage),
            interval=settings.sample_seconds,
            timeout=min(settings.timeout, settings.sample_seconds * 2),
            auth=auth,
            ca_file=settings.ssl_ca_file or None,
        )
    shared = None
    kafka_for = None
    if settings.auth == "basic":
        shared = KafkaAccess(connection(settings, settings.sasl_username, settings.sasl_password))
    else:

        def kafka_for(username: str, password: str) -> KafkaAccess:
            return KafkaAccess(connection(settings, username, password))

    return Console(
        settings=settings,
        sessions=Sessions(settings.session_idle, settings.session_max),
        throttle=Throttle(),
        templates=templates(),
        shared_kafka=shared,
        storage=storage,
        metrics=metrics,
        kafka_for=kafka_for,
    )


def main(environ: Mapping[str, str] | None = None) -> int:
    from kafscale.console.app import create_app  # aiohttp's routes: only when serving

    environ = os.environ if environ is None else environ
    try:
        settings = load(environ)
    except ValueError as exc:
        print(f"kafscale console: {exc}", file=sys.stderr)
        return 2
    secrets = (settings.ui_password, settings.sasl_password, settings.metrics_password)
    logs.setup("console", environ.get("KAFSCALE_LOG_LEVEL", "info"), [s for s in secrets if s])
    try:
        state = build(settings, environ)
    except Exception as exc:  # a metadata store or CA file that cannot be opened: say which
        print(f"kafscale console: cannot start: {exc}", file=sys.stderr)
        return 2
    log.info(
        "console starting",
        extra={
            "listen": f"{settings.host}:{settings.port}",
            "bootstrap": settings.bootstrap,
            "auth": settings.auth,
            "metadata": settings.metadata,
        },
    )
    web.run_app(
        create_app(state),
        host=settings.host,
        port=settings.port,
        print=None,
        access_log=None,
        handle_signals=True,
    )
    return 0
