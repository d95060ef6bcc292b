"""What every page of the console shares: the `Console` state the handlers read (settings,
sessions, the Kafka identity's clients, the storage and metrics samplers), template rendering,
flash messages, and running a blocking Kafka call off the event loop."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

import jinja2
from aiohttp import web

from kafscale.console import charts
from kafscale.console.auth import Session, Sessions, Throttle
from kafscale.console.kafka import KafkaAccess
from kafscale.console.metrics import MetricsSampler
from kafscale.console.settings import ConsoleSettings
from kafscale.console.storage import StorageView
from kafscale.kafka_admin import AdminError

T = TypeVar("T")
PAGE_SIZE = 100
NOTHING = "\u2013"  # an en dash: what a cell shows for a value not known


@dataclass
class Console:
    settings: ConsoleSettings
    sessions: Sessions
    throttle: Throttle
    templates: jinja2.Environment
    # auth basic: the console's one Kafka identity; auth sasl: None (each session has its own)
    shared_kafka: KafkaAccess | None
    storage: StorageView | None
    metrics: MetricsSampler | None
    # How a logged-in user's Kafka identity is made (auth sasl): (username, password) -> access
    kafka_for: Callable[[str, str], KafkaAccess] | None = None
    security: dict[str, Any] = field(default_factory=dict)  # what the cluster enforces (cached)


CONSOLE = web.AppKey("console", Console)


def console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def session(request: web.Request) -> Session:
    found: Session = request["session"]
    return found


def kafka(request: web.Request) -> KafkaAccess:
    shared = console(request).shared_kafka
    if shared is not None:
        return shared
    access: KafkaAccess = session(request).resources["kafka"]
    return access


async def call(function: Callable[..., T], *args: Any) -> T:
    """Run a blocking Kafka call (a `KafkaAccess` method, bound to the request's identity) in
    a worker thread."""
    return await asyncio.to_thread(function, *args)


def flash(request: web.Request, level: str, text: str) -> None:
    """A message shown once, on the next page this session renders."""
    session(request).resources.setdefault("flash", []).append((level, text))


def redirect(location: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(location)


def failed(request: web.Request, exc: AdminError, location: str) -> web.HTTPSeeOther:
    flash(request, "error", str(exc))
    return redirect(location)


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    current: Session | None = request.get("session")
    messages = current.resources.pop("flash", []) if current is not None else []
    page = console(request).templates.get_template(template)
    text = page.render(
        session=current,
        csrf=current.csrf if current is not None else "",
        flashes=messages,
        path=request.path,
        console=console(request),
        **context,
    )
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _timestamp(ms: int) -> str:
    if ms is None or ms < 0:
        return NOTHING
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}Z"


def _retention(value: str | None) -> str:
    """retention.ms as a person reads it."""
    try:
        ms = int(value or "")
    except ValueError:
        return value or NOTHING
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _static_versions() -> dict[str, str]:
    """Each static file's content digest: its URL changes when it does (cache busting)."""
    folder = resources.files("kafscale.console") / "static"
    return {
        item.name: hashlib.sha256(item.read_bytes()).hexdigest()[:12]
        for item in folder.iterdir()
        if item.is_file()
    }


def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kafscale.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = charts.format_bytes
    env.filters["timestamp"] = _timestamp
    env.filters["number"] = lambda n: NOTHING if n is None or n < 0 else f"{n:,}"
    env.filters["age"] = lambda ms: charts.format_age(ms, int(time.time() * 1000))
    env.filters["retention"] = _retention
    versions = _static_versions()
    env.globals["static"] = lambda name: f"/static/{name}?v={versions.get(name, '0')}"
    return env


def parse_moment(text: str, name: str = "timestamp") -> int:
    """Unix milliseconds from ms digits or an ISO 8601 time (UTC unless it says otherwise)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: {text!r} is neither ms nor ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def form_int(form: Any, name: str, default: int | None = None, low: int = 0) -> int:
    text = str(form.get(name, "")).strip()
    if not text and default is not None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: {text!r} is not a whole number") from None
    if value < low:
        raise web.HTTPBadRequest(text=f"{name}: {value} is below {low}")
    return value


def page_of(items: list[T], request: web.Request) -> tuple[list[T], int, int]:
    """One page of ``items`` (?page=N, 1-based): the page, its number, how many pages."""
    pages = max(1, -(-len(items) // PAGE_SIZE))
    try:
        number = min(pages, max(1, int(request.query.get("page", "1"))))
    except ValueError:
        number = 1
    return items[(number - 1) * PAGE_SIZE : number * PAGE_SIZE], number, pages
