"""The browser harness (tests/harness/browser.py) end to end: Debian's Chromium under Playwright
fills and submits a form served by a local HTTP server, screenshots come out as PNGs, a failing
browser test leaves a screenshot, and asyncio still runs beside the browser.
"""

from __future__ import annotations

import asyncio
import html
import os
import struct
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.harness.browser import VIEWPORT_HEIGHT, VIEWPORT_WIDTH, asyncio_allowed, screenshot
from tests.harness.paths import ROOT
from tests.harness.procs import LOOPBACK

pytestmark = pytest.mark.integration

FORM = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign up</title></head>
<body>
<h1>Sign up</h1>
<form method="post" action="/submit">
  <label>Name <input name="name" required></label>
  <label>Colour <select name="colour"><option>red</option><option>blue</option></select></label>
  <label><input type="checkbox" name="news" value="yes"> News</label>
  <button type="submit">Send</button>
</form>
</body></html>
"""


class FormServer:
    """A tiny HTTP server on an ephemeral loopback port: GET / is FORM, POST /submit records the
    decoded form and answers a page that echoes it."""

    def __init__(self) -> None:
        self.received: list[dict[str, list[str]]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply(200, FORM)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
                received.append(form)
                name = html.escape(form["name"][0])
                colour = html.escape(form["colour"][0])
                news = "with" if form.get("news") == ["yes"] else "without"
                self._reply(
                    200,
                    f'<!doctype html><html><head><meta charset="utf-8"><title>Thanks</title>'
                    f'</head><body><p id="result">Thanks, {name}: {colour}, {news} news</p>'
                    f"</body></html>",
                )

            def _reply(self, status: int, page: str) -> None:
                data = page.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def form_server() -> Iterator[FormServer]:
    server = FormServer()
    try:
        yield server
    finally:
        server.close()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_fills_and_submits_a_form(browser_page: Page, form_server: FormServer) -> None:
    page = browser_page
    page.goto(form_server.url)
    expect(page).to_have_title("Sign up")
    page.get_by_label("Name").fill("Ada Lovelace & Émilie <du Châtelet>")
    page.get_by_label("Colour").select_option("blue")
    page.get_by_label("News").check()
    page.get_by_role("button", name="Send").click()

    expect(page.locator("#result")).to_have_text(
        "Thanks, Ada Lovelace & Émilie <du Châtelet>: blue, with news"
    )
    assert page.url == f"{form_server.url}/submit"
    assert form_server.received == [
        {"name": ["Ada Lovelace & Émilie <du Châtelet>"], "colour": ["blue"], "news": ["yes"]}
    ]
    assert page.viewport_size == {"width": VIEWPORT_WIDTH, "height": VIEWPORT_HEIGHT}


def test_screenshot_is_a_png_at_the_fixed_viewport(
    browser_page: Page, form_server: FormServer, tmp_path: Path
) -> None:
    page = browser_page
    page.set_viewport_size({"width": 800, "height": 600})
    page.goto(form_server.url)
    path = screenshot(page, "form", directory=tmp_path / "docs")
    assert path == tmp_path / "docs" / "form.png"
    assert png_size(path) == (VIEWPORT_WIDTH, VIEWPORT_HEIGHT)
    assert sorted(p.name for p in path.parent.iterdir()) == ["form.png"]
    with pytest.raises(ValueError):
        screenshot(page, "../escape", directory=tmp_path)


async def _answer() -> str:
    await asyncio.sleep(0)
    return "ran"


@pytest.fixture
def asyncio_fixture() -> Iterator[str]:
    """A fixture that runs asyncio in its setup and teardown, as harness helpers do."""
    result = asyncio.run(_answer())
    yield result
    assert asyncio.run(_answer()) == "ran"


def test_asyncio_runs_around_and_inside_a_browser_test(
    asyncio_fixture: str, browser_page: Page, form_server: FormServer
) -> None:
    # Set up before browser_page and torn down after it: asyncio.run() works in both.
    assert asyncio_fixture == "ran"
    browser_page.goto(form_server.url)
    # While the page can be driven, Playwright's loop is the thread's running loop...
    coro = _answer()
    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(coro)
    coro.close()
    # ...except in asyncio_allowed(), and in other threads.
    with asyncio_allowed():
        assert asyncio.run(_answer()) == "ran"
    answers: list[str] = []
    thread = threading.Thread(target=lambda: answers.append(asyncio.run(_answer())))
    thread.start()
    thread.join()
    assert answers == ["ran"]
    # And the browser goes on after both.
    expect(browser_page.get_by_role("heading")).to_have_text("Sign up")


def test_a_failing_browser_test_leaves_a_screenshot(tmp_path: Path) -> None:
    # A pytest of its own, in a subprocess: this test must not fail for real.
    (tmp_path / "test_fails.py").write_text(
        textwrap.dedent(
            """
            def test_fails(browser_page):
                browser_page.set_content("<h1>Not what the test wanted</h1>")
                assert browser_page.inner_text("h1") == "What the test wanted"
            """
        )
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.harness.browser",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'base'}",
            "test_fails.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed" in run.stdout, run.stdout
    shots = list((tmp_path / "base").rglob("failure.png"))
    assert len(shots) == 1, run.stdout
    assert f"screenshot of the page when the test failed (about:blank): {shots[0]}" in run.stdout
    assert png_size(shots[0]) == (VIEWPORT_WIDTH, VIEWPORT_HEIGHT)
