"""The console (issue 19) driven in a real browser: Debian's Chromium, headless, through
Playwright (tests/harness/browser.py), against `kafscale console` and a broker as real processes
on a real etcd and MinIO.

The tests log in, create a topic, produce a message and find it in the browser, watch a group's
lag fall as it consumes, reset its offsets, manage users and ACLs over SASL, and are refused
without a session. They take the screenshots of docs/console/ (shown in README's console
section) on the way.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.browser import screenshot
from tests.harness.console import PASSWORD, USERNAME, ConsoleProcess
from tests.harness.procs import wait_until

from .test_security import ADMIN, ADMIN_PASSWORD, start_secure

pytestmark = pytest.mark.integration

expect: Any = None  # playwright.sync_api.expect, imported with the browser fixture's module


@pytest.fixture(autouse=True)
def _expect() -> None:
    global expect
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=20_000)
    expect = playwright_expect


@pytest.fixture
def cluster(
    start_broker: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[Any, ConsoleProcess]]:
    broker = start_broker(backends="real", ready=True)
    console = ConsoleProcess(
        tmp_path / "console",
        broker.env,
        broker.bootstrap,
        metrics_url=f"http://127.0.0.1:{broker.metrics_port}/metrics",
    )
    console.start_first()
    try:
        yield broker, console
    finally:
        console.stop()


def log_in(
    page: Any, console: ConsoleProcess, user: str = USERNAME, password: str = PASSWORD
) -> None:
    page.goto(f"{console.url}/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def consume(bootstrap: str, topic: str, group: str, count: int) -> None:
    """Join ``group``, read ``count`` records, commit them and leave (the group is then empty)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    try:
        deadline_polls = 600
        while seen < count and deadline_polls:
            deadline_polls -= 1
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            seen += 1
            if seen == count:
                consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    assert seen == count, f"consumed {seen} of {count}"


def test_without_a_session_everything_is_refused(
    cluster: tuple[Any, ConsoleProcess], browser_page: Any
) -> None:
    _, console = cluster
    opener = urllib.request.build_opener(NoRedirect())
    # A browser is sent to the login page, and back where it wanted to go after logging in.
    page = browser_page
    page.goto(f"{console.url}/topics?q=x")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    expect(page.locator("h1")).to_have_text("Log in")
    # Anything else gets 401; a POST without a session never reaches its handler.
    for method, path in (("GET", "/topics"), ("POST", "/topics"), ("POST", "/groups/g/delete")):
        request = urllib.request.Request(
            f"{console.url}{path}", method=method, data=b"" if method == "POST" else None
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=10)
        assert refused.value.code == 401, (method, path)
    # A wrong password is refused with a message; repeated failures are throttled.
    log_in(page, console, password="wrong")
    expect(page.locator(".flash.error")).to_contain_text("Wrong user name or password")
    for _ in range(3):
        log_in(page, console, password="wrong")
    expect(page.locator(".flash.error")).to_contain_text("Too many failed logins")
    assert "wrong" not in console.log_text()


def test_a_post_without_the_csrf_token_is_refused(
    cluster: tuple[Any, ConsoleProcess], browser_page: Any
) -> None:
    _, console = cluster
    page = browser_page
    log_in(page, console)
    expect(page.locator("h1")).to_have_text("Overview")
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["kafscale_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    forged = page.request.post(f"{console.url}/topics", form={"name": "forged", "partitions": "1"})
    assert forged.status == 403
    assert "CSRF" in forged.text()
    page.goto(f"{console.url}/topics")
    expect(page.locator("#topics")).not_to_contain_text("forged")
    # Logging out ends the session on the server: the old cookie opens nothing.
    page.click("text=Log out")
    expect(page).to_have_url(re.compile(r"/login"))
    stale = urllib.request.Request(
        f"{console.url}/topics", headers={"Cookie": f"kafscale_session={session['value']}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(NoRedirect()).open(stale, timeout=10)
    assert refused.value.code == 401


def test_create_a_topic_produce_and_find_the_message(
    cluster: tuple[Any, ConsoleProcess], browser_page: Any
) -> None:
    broker, console = cluster
    page = browser_page
    screenshot_login(page, console)
    log_in(page, console)
    expect(page.locator("h1")).to_have_text("Overview")
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    page.click("nav >> text=Topics")
    page.click("summary:has-text('Create a topic')")
    page.fill("input[name=name]", topic)
    page.fill("input[name=partitions]", "3")
    page.fill("textarea[name=configs]", "retention.ms=86400000")
    page.click("button:has-text('Create topic')")
    expect(page.locator(".flash.ok")).to_contain_text(f"Topic {topic} created with 3 partitions")
    expect(page.locator("#partitions tbody tr")).to_have_count(3)
    expect(page.locator("#configs")).to_contain_text("86400000")

    page.click("text=Browse messages")
    page.click("summary:has-text('Produce a message')")
    page.fill("#produce input[name=partition]", "1")
    page.fill("#produce input[name=key]", "order-42")
    page.fill("#produce textarea[name=value]", '{"item": "book", "qty": 2}')
    page.fill("#produce textarea[name=headers]", "trace: abc-123")
    page.click("button:has-text('Produce')")
    expect(page.locator(".flash.ok")).to_contain_text("Produced to partition 1 at offset 0")
    rows = page.locator("#messages tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("order-42")
    expect(rows.first).to_contain_text("trace")
    # Other records around it: the filter by key finds ours only; JSON is pretty-printed.
    produce(broker.bootstrap, topic, 20, partition=1)
    page.goto(
        f"{console.url}/topics/{topic}/messages?partition=all&start=beginning&key=order-&format=json"
    )
    expect(rows).to_have_count(1)
    expect(page.locator("#messages pre.json")).to_contain_text('"qty": 2')
    page.goto(f"{console.url}/topics/{topic}/messages?partition=1&start=offset&offset=15&limit=3")
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator("td").nth(1)).to_have_text("15")
    page.goto(f"{console.url}/topics/{topic}/messages?partition=1&start=end&limit=5&format=hex")
    expect(rows).to_have_count(5)
    expect(rows.last).to_contain_text("76 31 39")  # "v19" in hex
    screenshot(page, "messages")

    # The list finds it by name; its detail shows the high watermark, and the stored data once
    # the broker's write path committed it to S3.
    page.goto(f"{console.url}/topics?q={topic[:10]}")
    expect(page.locator("#topics tbody tr")).to_have_count(1)
    expect(page.locator("#topics")).to_contain_text("1 d")
    page.goto(f"{console.url}/topics/{topic}")
    expect(page.locator("#partitions tbody tr").nth(1)).to_contain_text("21")

    def stored() -> bool:
        page.reload()
        cell = page.locator("#partitions tbody tr").nth(1).locator("td").nth(6).inner_text()
        return cell not in ("\u2013", "0 B")

    wait_until(stored, timeout=60, what="the partition's bytes in S3 on the topic page")
    screenshot(page, "topic")
    page.goto(f"{console.url}/topics")
    screenshot(page, "topics")

    # Add partitions, change and reset a config, then delete it by typing its name.
    page.goto(f"{console.url}/topics/{topic}")
    page.fill("input[name=partitions]", "4")
    page.click("button:has-text('Add partitions')")
    expect(page.locator("#partitions tbody tr")).to_have_count(4)
    page.fill("textarea[name=set]", "cleanup.policy=delete\nretention.bytes=1048576")
    page.click("button:has-text('Apply config changes')")
    expect(page.locator("#configs tr.set")).to_contain_text(["retention.bytes"])
    page.check("input[name=reset][value='retention.bytes']")
    page.click("button:has-text('Apply config changes')")
    expect(page.locator(".flash.ok")).to_contain_text("Configs of")
    expect(page.locator("input[name=reset][value='retention.bytes']")).to_have_count(0)
    page.fill("input[name=confirm]", "not-the-name")
    page.click("button:has-text('Delete topic')")
    expect(page.locator(".flash.error")).to_contain_text("Type the topic's name")
    page.fill("input[name=confirm]", topic)
    page.click("button:has-text('Delete topic')")
    expect(page.locator(".flash.ok")).to_contain_text(f"Topic {topic} deleted")
    expect(page.locator("#topics")).not_to_contain_text(topic)

    # The overview: the broker, its S3 and etcd up, traffic charts, an S3 estimate.
    page.goto(f"{console.url}/")
    expect(page.locator("#brokers tbody tr")).to_have_count(1)
    expect(page.locator("#health")).to_contain_text("up")
    expect(page.locator("figure.chart svg")).to_have_count(3)
    expect(page.locator("#cost")).to_contain_text("Total")
    screenshot(page, "overview")


def test_a_groups_lag_falls_as_it_consumes_and_its_offsets_reset(
    cluster: tuple[Any, ConsoleProcess], browser_page: Any
) -> None:
    broker, console = cluster
    page = browser_page
    topic, group = f"events-{uuid.uuid4().hex[:6]}", f"billing-{uuid.uuid4().hex[:6]}"
    produce(broker.bootstrap, topic, 100)
    consume(broker.bootstrap, topic, group, 10)
    log_in(page, console)
    page.goto(f"{console.url}/groups")
    expect(page.locator("#groups")).to_contain_text(group)
    page.click(f"text={group}")
    total = page.locator("#total-lag")
    expect(total).to_have_text("90")
    consume(broker.bootstrap, topic, group, 60)  # from its committed offset: 10 + 60
    page.reload()
    expect(total).to_have_text("30")
    consume(broker.bootstrap, topic, group, 30)
    page.reload()
    expect(total).to_have_text("0")
    expect(page.locator("#offsets")).to_contain_text("100")
    # The lag chart samples the broker's kafscale_consumer_lag: it has points by now.
    wait_until(
        lambda: page.reload() or page.locator("figure.chart svg polyline").count() > 0,
        timeout=30,
        what="the lag chart's line",
    )
    screenshot(page, "group")

    page.select_option("select[name=how]", "earliest")
    page.click("button:has-text('Reset offsets')")
    expect(page.locator(".flash.ok")).to_contain_text("reset to earliest on 1 partition")
    expect(total).to_have_text("100")
    page.select_option("select[name=how]", "offset")
    page.fill("#reset input[name=offset]", "75")
    page.click("button:has-text('Reset offsets')")
    expect(total).to_have_text("25")
    page.goto(f"{console.url}/groups")
    screenshot(page, "groups")
    page.click(f"text={group}")
    page.click("button:has-text('Delete group')")
    expect(page.locator(".flash.ok")).to_contain_text(f"Group {group} deleted")
    expect(page.locator("#groups")).not_to_contain_text(group)


def test_users_and_acls_with_sasl_logins(
    start_broker: Callable[..., Any], tmp_path: Path, browser_page: Any
) -> None:
    secure = start_secure(
        start_broker, tmp_path, KAFSCALE_AUTHORIZER="acl", KAFSCALE_SUPER_USERS=f"User:{ADMIN}"
    )
    console = ConsoleProcess(
        tmp_path / "console",
        secure.broker.env,
        secure.address(secure.sasl_ssl),
        env={
            "KAFSCALE_CONSOLE_AUTH": "sasl",
            "KAFSCALE_CONSOLE_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFSCALE_CONSOLE_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFSCALE_CONSOLE_SSL_CA_FILE": str(secure.pki.ca_file),
            "KAFSCALE_UI_USERNAME": "",
            "KAFSCALE_UI_PASSWORD": "",
        },
    )
    console.start_first()
    page = browser_page
    try:
        log_in(page, console, ADMIN, "not-the-password")
        expect(page.locator(".flash.error")).to_contain_text("Wrong user name or password")
        log_in(page, console, ADMIN, ADMIN_PASSWORD)
        expect(page.locator("h1")).to_have_text("Overview")
        page.click("nav >> text=Users")
        expect(page.locator("#users")).to_contain_text(ADMIN)
        page.click("summary:has-text('Add a user')")
        page.fill("#user-form input[name=user]", "carol")
        page.fill("#user-form input[name=password]", "carol-secret-1")
        page.click("button:has-text('Store credential')")
        expect(page.locator(".flash.ok")).to_contain_text(
            "SCRAM-SHA-512 credential of carol stored"
        )
        expect(page.locator("#users")).to_contain_text("carol")
        page.click("summary:has-text('Add an ACL')")
        page.fill("#acl-form input[name=principal]", "User:carol")
        page.select_option("#acl-form select[name=operation]", "READ")
        page.fill("#acl-form input[name=name]", "reports")
        page.select_option("#acl-form select[name=pattern]", "PREFIXED")
        page.click("button:has-text('Create ACL')")
        expect(page.locator("#acls")).to_contain_text("User:carol")
        expect(page.locator("#acls")).to_contain_text("prefixed")
        screenshot(page, "security")
        page.click("text=Log out")

        # carol logs in with her own credential: the brokers' ACLs decide what she sees.
        log_in(page, console, "carol", "carol-secret-1")
        expect(page.locator("h1")).to_have_text("Overview")
        page.goto(f"{console.url}/security")
        expect(page.locator(".flash.error").first).to_contain_text("AUTHORIZATION")
        page.click("text=Log out")

        log_in(page, console, ADMIN, ADMIN_PASSWORD)
        page.goto(f"{console.url}/security")
        page.locator("#acls tr", has_text="User:carol").locator("button").click()
        expect(page.locator(".flash.ok")).to_contain_text("ACL deleted")
        page.locator("#users tr", has_text="carol").locator("button").click()
        expect(page.locator("#users")).not_to_contain_text("carol")
    finally:
        console.stop()


def test_the_console_refuses_to_start_without_a_login(tmp_path: Path) -> None:
    import subprocess

    from tests.harness.console import KAFSCALE

    env = {"PATH": "/usr/bin:/bin", "KAFSCALE_UI_USERNAME": "ops"}
    done = subprocess.run(
        [str(KAFSCALE), "console"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "KAFSCALE_UI_PASSWORD not set" in done.stderr
    assert "no default login" in done.stderr


def screenshot_login(page: Any, console: ConsoleProcess) -> None:
    page.goto(f"{console.url}/login")
    screenshot(page, "login")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
