"""The console's web application: middlewares (server time, security headers, sessions, CSRF),
login and logout, and the routes of every page (docs/design/console.md, sections 3 and 4).

Every route but ``/login``, ``/healthz`` and ``/static`` needs a session: a browser is sent to
``/login`` (and back after it), anything else gets 401. Every POST must carry the session's CSRF
token in its ``csrf`` field (403 without it). Failed logins are throttled per address and per user
name (429 with Retry-After), and logged without the password."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

from kafscale.console import groups, messages, overview, security, topics
from kafscale.console.auth import COOKIE, same_secret
from kafscale.console.web import CONSOLE, Console, console, render
from kafscale.kafka_admin import AdminError

log = logging.getLogger("kafscale.console")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = ("/login", "/healthz", "/static/")
# No inline script or style anywhere: the page may load only its own files.
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


def _headers(response: web.StreamResponse, started: float) -> None:
    elapsed = time.perf_counter() - started
    response.headers["Server-Timing"] = f"app;dur={elapsed * 1000:.1f}"
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers.setdefault("Cache-Control", "no-store")


@web.middleware
async def timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The server time of every answer in a Server-Timing header (``bench/console.py`` reads
    it), and the security headers."""
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _headers(exc, started)
        raise
    _headers(response, started)
    return response


@web.middleware
async def kafka_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A page whose Kafka call failed (no broker answered, a refusal) says so, with what the
    broker or librdkafka answered, instead of a bare 500."""
    try:
        return await handler(request)
    except AdminError as exc:
        log.warning("a page's Kafka call failed", extra={"path": request.path, "error": str(exc)})
        return render(request, "error.html", status=502, message=str(exc))


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = console(request)
    request["session"] = state.sessions.get(request.cookies.get(COOKIE))
    if request.path.startswith(OPEN_PATHS):
        return await handler(request)
    if request["session"] is None:
        if request.method == "GET" and "text/html" in request.headers.get("Accept", ""):
            back = urllib.parse.quote(request.path_qs, safe="")
            raise web.HTTPSeeOther(f"/login?next={back}")
        raise web.HTTPUnauthorized(text="log in first: no session")
    if request.method == "POST":
        form = await request.post()
        token = form.get("csrf")
        if not request["session"].check_csrf(token if isinstance(token, str) else None):
            log.warning("POST without a valid CSRF token refused", extra={"path": request.path})
            raise web.HTTPForbidden(
                text="the form's CSRF token is missing or wrong: reload the page"
            )
    return await handler(request)


def _next(target: str) -> str:
    """Only a path on this site: never an absolute URL (an open redirect)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def login_page(request: web.Request) -> web.StreamResponse:
    if request["session"] is not None:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", next=_next(request.query.get("next", "/")), error=None)


async def login(request: web.Request) -> web.StreamResponse:
    state = console(request)
    form = await request.post()
    username = str(form.get("username", ""))
    password = str(form.get("password", ""))
    target = _next(str(form.get("next", "/")))
    address = request.remote or "unknown"
    keys = (f"addr:{address}", f"user:{username}")
    wait = state.throttle.wait(*keys)
    if wait > 0:
        log.warning("login throttled", extra={"user": username, "remote": address})
        response = render(
            request,
            "login.html",
            status=429,
            next=target,
            error=f"Too many failed logins: try again in {wait:.0f} s.",
        )
        response.headers["Retry-After"] = str(max(1, round(wait)))
        return response
    access = None
    error = None
    if state.settings.auth == "basic":
        ok = same_secret(username, state.settings.ui_username) & same_secret(
            password, state.settings.ui_password
        )
    else:
        assert state.kafka_for is not None
        kafka_for = state.kafka_for
        try:
            access = await asyncio.to_thread(kafka_for, username, password)
            await asyncio.to_thread(access.check)
            ok = True
        except AdminError as exc:
            ok = False
            if access is not None:
                access.close()
            if "AUTHENTICATION" not in exc.code.upper():
                error = f"The brokers did not answer the login: {exc}"
    if not ok:
        state.throttle.failed(*keys)
        log.warning("login failed", extra={"user": username, "remote": address})
        return render(
            request,
            "login.html",
            status=401 if error is None else 503,
            next=target,
            error=error or "Wrong user name or password.",
        )
    state.throttle.succeeded(*keys)
    session = state.sessions.create(username)
    if access is not None:
        session.resources["kafka"] = access
        session.on_close.append(access.close)
    log.info("login", extra={"user": username, "remote": address})
    response = web.HTTPSeeOther(target)
    response.set_cookie(
        COOKIE,
        session.id,
        httponly=True,
        samesite="Strict",
        secure=state.settings.secure_cookies,
        path="/",
    )
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    state = console(request)
    session = request["session"]
    state.sessions.end(session.id)
    log.info("logout", extra={"user": session.username})
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok\n")


async def _expire_sessions(app: web.Application) -> None:
    while True:
        await asyncio.sleep(60)
        app[CONSOLE].sessions.expire()


async def _background(app: web.Application):  # type: ignore[no-untyped-def]
    state = app[CONSOLE]
    if state.storage is not None:
        state.storage.start()
    if state.metrics is not None:
        state.metrics.start()
    task = asyncio.create_task(_expire_sessions(app))
    yield
    task.cancel()
    if state.metrics is not None:
        state.metrics.stop()
    if state.storage is not None:
        state.storage.stop()
    state.sessions.close()
    if state.shared_kafka is not None:
        state.shared_kafka.close()


def create_app(state: Console) -> web.Application:
    app = web.Application(middlewares=[timing, authenticate, kafka_errors], client_max_size=1024**2)
    app[CONSOLE] = state
    app.cleanup_ctx.append(_background)
    static = resources.files("kafscale.console") / "static"
    app.router.add_static("/static/", str(static))
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/healthz", healthz)
    overview.register(app.router)
    topics.register(app.router)
    messages.register(app.router)
    groups.register(app.router)
    security.register(app.router)
    return app
