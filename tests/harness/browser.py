"""A real browser for the console's tests: Debian's Chromium, headless, driven by Playwright.

Fixtures (a pytest plugin, registered by tests/conftest.py):
- `chromium` (session scope, one per pytest-xdist worker): a `playwright.sync_api.Browser`,
  Chromium launched headless from $KAFSCALE_TEST_CHROMIUM or /usr/bin/chromium (the apt package
  scripts/install-deps.sh installs; Playwright never downloads a browser here);
- `browser_page` (function scope): a fresh BrowserContext's Page, viewport 1280x800, closed after
  the test. When the test fails, a screenshot of the page goes to the test's tmp_path and its
  path is shown in the failure report (section "browser screenshot").
And `screenshot(page, name)`, which writes docs/console/NAME.png at the fixed viewport.

Nothing is skipped: without Chromium or Playwright the fixture fails and says to run
scripts/install-deps.sh.

Playwright's sync API runs an asyncio loop of its own in a greenlet of the test's thread and
needs it marked as the thread's running loop whenever Python code may call it (its objects make
futures on "the running loop"); it marks it after every call. While it is marked, `asyncio.run()`
refuses to start in that thread. So it is marked only where a test drives the browser: from
`browser_page`'s setup to its teardown (fixtures set up after it, e.g. one that logs in, may
drive the page), and in the body of a test that uses `chromium` directly. Fixtures set up before
`browser_page` (torn down after it), and every test without the browser, run with no running
loop and use asyncio as usual. Inside a browser test, wrap asyncio code in
`with asyncio_allowed():` (no browser calls inside the block), or run it in another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.harness.paths import ROOT
from tests.harness.procs import HarnessError

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright, ViewportSize

CHROMIUM_ENV = "KAFSCALE_TEST_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
# As root (no user namespace for Chromium's sandbox) and in containers whose /dev/shm is small.
CHROMIUM_ARGS = ("--no-sandbox", "--disable-dev-shm-usage")
VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 1280, 800
DOCS_SCREENSHOTS = ROOT / "docs" / "console"

_INSTALL_HINT = "run scripts/install-deps.sh"


def _viewport() -> ViewportSize:
    return {"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT}


def find_chromium() -> str:
    path = os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        source = f"${CHROMIUM_ENV}" if os.environ.get(CHROMIUM_ENV) else "the default"
        raise HarnessError(
            f"Chromium is not installed at {path} ({source}): {_INSTALL_HINT} "
            f"(apt package chromium), or point ${CHROMIUM_ENV} at a Chromium binary"
        )
    return path


@contextlib.contextmanager
def _driving(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Mark Playwright's loop as the thread's running loop (as its sync API expects on every
    call) for the block, and restore what was there before (normally none)."""
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(loop)
    try:
        yield
    finally:
        asyncio._set_running_loop(previous)


@contextlib.contextmanager
def asyncio_allowed() -> Iterator[None]:
    """For the body of a browser test: no loop is marked running in this block, so asyncio code
    (`asyncio.run()`, harness helpers built on it) runs; the browser must not be driven in it."""
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(previous)


@dataclass
class BrowserSession:
    """One Playwright driver and one Chromium, for one pytest process."""

    playwright: Playwright
    browser: Browser
    loop: asyncio.AbstractEventLoop

    def driving(self) -> contextlib.AbstractContextManager[None]:
        return _driving(self.loop)

    def close(self) -> None:
        with self.driving():
            try:
                self.browser.close()
            finally:
                self.playwright.stop()


def launch_chromium() -> BrowserSession:
    executable = find_chromium()
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        raise HarnessError(f"playwright is not installed ({exc}): {_INSTALL_HINT}") from exc
    previous = asyncio._get_running_loop()
    if previous is not None:
        raise HarnessError("the browser fixtures cannot start inside a running asyncio loop")
    try:
        playwright = sync_playwright().start()
    except Exception as exc:
        raise HarnessError(f"Playwright's driver did not start: {exc}") from exc
    # Playwright leaves its loop marked as running in this thread after each sync call.
    loop = asyncio._get_running_loop()
    asyncio._set_running_loop(previous)
    if loop is None:
        with contextlib.suppress(Exception):
            playwright.stop()
        raise HarnessError("Playwright's sync API did not mark its event loop as running")
    with _driving(loop):
        try:
            browser = playwright.chromium.launch(
                executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
            )
        except Error as exc:
            playwright.stop()
            raise HarnessError(
                f"Chromium at {executable} did not start under Playwright: {exc.message}"
            ) from exc
    return BrowserSession(playwright, browser, loop)


_SESSION = pytest.StashKey[BrowserSession]()
_FAILURE_PAGE = pytest.StashKey[tuple["Page", Path]]()


@pytest.fixture(scope="session")
def chromium(pytestconfig: pytest.Config) -> Iterator[Browser]:
    """Headless Chromium (a Playwright `Browser`), launched once per pytest process."""
    failure = None
    try:
        session = launch_chromium()
    except HarnessError as exc:
        failure = str(exc)
    if failure is not None:  # outside the except: the message alone, no chained traceback
        pytest.fail(failure, pytrace=False)
    pytestconfig.stash[_SESSION] = session
    try:
        yield session.browser
    finally:
        del pytestconfig.stash[_SESSION]
        session.close()


@pytest.fixture
def browser_page(
    request: pytest.FixtureRequest, chromium: Browser, tmp_path: Path
) -> Iterator[Page]:
    """A Page in a fresh BrowserContext (no cookies or storage from other tests), 1280x800,
    en-US, UTC. On failure its screenshot is saved as tmp_path/failure.png."""
    session = request.config.stash[_SESSION]
    # Marked from here until the context is closed: see the module's docstring.
    with session.driving():
        context = chromium.new_context(
            viewport=_viewport(), device_scale_factor=1, locale="en-US", timezone_id="UTC"
        )
        try:
            page = context.new_page()
            request.node.stash[_FAILURE_PAGE] = (page, tmp_path)
            yield page
        finally:
            if _FAILURE_PAGE in request.node.stash:
                del request.node.stash[_FAILURE_PAGE]
            context.close()


def _uses_browser(item: pytest.Item) -> bool:
    return "chromium" in getattr(item, "fixturenames", ())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Run the body of a test that uses `chromium` with Playwright's loop marked as running
    (already so with `browser_page`; see the module's docstring)."""
    session = item.config.stash.get(_SESSION, None)
    if session is None or not _uses_browser(item):
        return (yield)
    with session.driving():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    shot = item.stash.get(_FAILURE_PAGE, None)
    session = item.config.stash.get(_SESSION, None)
    if report.when == "call" and report.failed and shot is not None and session is not None:
        page, tmp_path = shot
        path = tmp_path / "failure.png"
        try:
            with session.driving():
                page.screenshot(path=path, timeout=10_000)
            message = f"screenshot of the page when the test failed ({page.url}): {path}"
        except Exception as exc:
            message = f"no screenshot of the page ({page.url}): {exc}"
        report.sections.append(("browser screenshot", message))
    return report


def screenshot(page: Page, name: str, *, directory: Path = DOCS_SCREENSHOTS) -> Path:
    """Write the page as directory/NAME.png (default docs/console/), at 1280x800 (the page keeps
    that viewport if the test had changed it); returns the path. For the docs: call it from a
    browser test once the page shows what to document."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"screenshot name {name!r}: lowercase letters, digits and '-' only")
    if page.viewport_size != _viewport():
        page.set_viewport_size(_viewport())
    page.evaluate("document.fonts.ready.then(() => true)")
    png = page.screenshot(animations="disabled", caret="hide")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    # Whole or not at all: another pytest worker may be reading the docs directory.
    partial = path.with_name(f".{name}.{os.getpid()}.png")
    partial.write_bytes(png)
    partial.replace(path)
    return path
