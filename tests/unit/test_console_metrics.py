"""kafscale.console.metrics: reading scrapes, rates across scrapes, and the sampler's history,
errors and thread (against a local HTTP server)."""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from kafscale.console.metrics import (
    RATE_SERIES,
    MetricsSampler,
    Scrape,
    counter_rates,
    lag_by_group,
    merge_lag,
    parse,
    s3_request_rates,
)

# Part of a real /metrics page: kafscale.metrics' counters incremented in two child processes
# and the parent, aggregated by prometheus-client's MultiProcessCollector as the supervisor does
# (kafscale_backend_up is `liveall`: one sample per process, here one says objects is down).
REAL_SCRAPE = """\
# HELP kafscale_connections Open client connections
# TYPE kafscale_connections gauge
kafscale_connections 0.0
# HELP kafscale_consumer_lag High watermark minus the group's committed offset
# TYPE kafscale_consumer_lag gauge
kafscale_consumer_lag{group="audit",partition="0",topic="orders"} 11.0
kafscale_consumer_lag{group="billing",partition="0",topic="orders"} 5.0
kafscale_consumer_lag{group="billing",partition="1",topic="orders"} 7.0
# HELP kafscale_network_bytes_in_total Request bytes received
# TYPE kafscale_network_bytes_in_total counter
kafscale_network_bytes_in_total 2.2e+06
# HELP kafscale_network_bytes_out_total Response bytes sent
# TYPE kafscale_network_bytes_out_total counter
kafscale_network_bytes_out_total 5.2e+06
# HELP kafscale_produced_records_total Records appended to partition buffers
# TYPE kafscale_produced_records_total counter
kafscale_produced_records_total 0.0
# HELP kafscale_produced_bytes_total Batch bytes appended to partition buffers
# TYPE kafscale_produced_bytes_total counter
kafscale_produced_bytes_total 2e+06
# HELP kafscale_fetch_bytes_total Record batch bytes returned to Fetch requests
# TYPE kafscale_fetch_bytes_total counter
kafscale_fetch_bytes_total 5e+06
# HELP kafscale_requests_total Kafka requests handled
# TYPE kafscale_requests_total counter
kafscale_requests_total{api="produce"} 240.0
kafscale_requests_total{api="fetch"} 600.0
kafscale_requests_total{api="metadata"} 8.0
# HELP kafscale_s3_requests_total Object store requests by operation (get, put, list, ...)
# TYPE kafscale_s3_requests_total counter
kafscale_s3_requests_total{operation="put"} 80.0
kafscale_s3_requests_total{operation="get"} 14.0
kafscale_s3_requests_total{operation="head"} 2.0
kafscale_s3_requests_total{operation="list"} 3.0
kafscale_s3_requests_total{operation="delete"} 1.0
# HELP kafscale_children_ready Child processes up and answering pings
# TYPE kafscale_children_ready gauge
kafscale_children_ready{pid="20529"} 0.0
kafscale_children_ready{pid="20520"} 0.0
# HELP kafscale_backend_up Whether a backend answered its last health check
# TYPE kafscale_backend_up gauge
kafscale_backend_up{backend="objects",pid="20529"} 0.0
kafscale_backend_up{backend="metadata",pid="20529"} 1.0
kafscale_backend_up{backend="objects",pid="20520"} 1.0
kafscale_backend_up{backend="metadata",pid="20520"} 1.0
# HELP kafscale_request_duration_seconds Time to answer a request
# TYPE kafscale_request_duration_seconds histogram
kafscale_request_duration_seconds_sum{api="produce"} 0.004
kafscale_request_duration_seconds_bucket{api="produce",le="0.005"} 2.0
kafscale_request_duration_seconds_bucket{api="produce",le="+Inf"} 2.0
kafscale_request_duration_seconds_count{api="produce"} 2.0
"""


def page(produced: float = 0, puts: float = 0, lag: Mapping[str, float] | None = None) -> str:
    """A small /metrics page in the same format."""
    lines = [
        "# TYPE kafscale_produced_bytes_total counter",
        f"kafscale_produced_bytes_total {produced}",
        "# TYPE kafscale_s3_requests_total counter",
        f'kafscale_s3_requests_total{{operation="put"}} {puts}',
        "# TYPE kafscale_consumer_lag gauge",
    ]
    for group, value in (lag or {}).items():
        lines.append(f'kafscale_consumer_lag{{group="{group}",partition="0",topic="t"}} {value}')
    lines.append('kafscale_backend_up{backend="objects",pid="1"} 1.0')
    return "\n".join(lines) + "\n"


def test_parse_reads_a_real_page() -> None:
    scrape = parse(REAL_SCRAPE, 100.0)
    assert scrape.time == 100.0
    assert scrape.counters == {
        "produce_bytes": 2e6,
        "fetch_bytes": 5e6,
        "network_in_bytes": 2.2e6,
        "network_out_bytes": 5.2e6,
        "requests": 848.0,
        "produce_requests": 240.0,
        "fetch_requests": 600.0,
        "s3_put": 80.0,
        "s3_get": 14.0,
        "s3_head": 2.0,
        "s3_list": 3.0,
        "s3_delete": 1.0,
    }
    # one process of two says objects is down: down
    assert scrape.backends == {"objects": False, "metadata": True}
    assert scrape.lag == {
        ("audit", "orders", 0): 11.0,
        ("billing", "orders", 0): 5.0,
        ("billing", "orders", 1): 7.0,
    }


def test_parse_refuses_what_is_not_a_metrics_page() -> None:
    with pytest.raises(ValueError):
        parse("<html>login</html>\n", 0.0)


def test_rates_between_two_scrapes() -> None:
    before = parse(page(produced=1000, puts=10), 100.0)
    after = parse(page(produced=6000, puts=30), 105.0)
    assert counter_rates(before, after) == {"produce_bytes": 1000.0, "s3_put": 4.0}
    assert counter_rates(after, before) == {}  # not later: no rate


def test_a_counter_that_appears_counts_from_zero() -> None:
    before = Scrape(0.0, {"s3_put": 5.0}, {}, {})
    after = Scrape(2.0, {"s3_put": 9.0, "s3_get": 4.0}, {}, {})
    assert counter_rates(before, after) == {"s3_put": 2.0, "s3_get": 2.0}


def test_a_broker_restart_takes_the_new_values_as_the_increase() -> None:
    before = Scrape(0.0, {"produce_bytes": 50_000.0, "s3_put": 100.0}, {}, {})
    # produce_bytes went down: the broker restarted. s3_put grew past its old value since the
    # restart, which alone would look like +20: it too counts from 0.
    after = Scrape(10.0, {"produce_bytes": 3000.0, "s3_put": 120.0}, {}, {})
    assert counter_rates(before, after) == {"produce_bytes": 300.0, "s3_put": 12.0}


def test_lag_merged_over_brokers_and_summed_per_group() -> None:
    one = Scrape(0.0, {}, {}, {("g", "t", 0): 4.0, ("g", "t", 1): 6.0})
    two = Scrape(0.0, {}, {}, {("g", "t", 0): 1.0, ("h", "t", 0): 2.0})  # an old coordinator
    merged = merge_lag([one, two])
    assert merged == {("g", "t", 0): 4.0, ("g", "t", 1): 6.0, ("h", "t", 0): 2.0}
    assert lag_by_group(merged) == {"g": 10.0, "h": 2.0}


def test_s3_request_rates() -> None:
    assert s3_request_rates({"s3_put": 4.0, "s3_get": 1.0, "produce_bytes": 9.0}) == {
        "put": 4.0,
        "get": 1.0,
    }


def sampler(history: int = 360) -> MetricsSampler:
    return MetricsSampler(lambda: [], history=history)


def test_two_urls_are_summed() -> None:
    metrics = sampler()
    metrics.record({"a": parse(page(0, 0), 0.0), "b": parse(page(0, 0), 0.0)}, {}, now=0.0)
    assert metrics.rates() == {} and metrics.series("produce_bytes") == []
    metrics.record({"a": parse(page(100, 10), 10.0), "b": parse(page(400, 0), 10.0)}, {}, now=10.0)
    assert metrics.series("produce_bytes") == [(10.0, 50.0)]
    assert metrics.series("s3_put") == [(10.0, 1.0)]
    rates = metrics.rates()
    assert set(rates) == set(RATE_SERIES)  # every series gets a point, 0 when not reported
    assert rates["produce_bytes"] == 50.0 and rates["fetch_bytes"] == 0.0
    assert metrics.s3_rates()["put"] == 1.0
    assert metrics.last_sample_time == 10.0


def test_a_failing_url_is_recorded_and_the_others_still_count() -> None:
    metrics = sampler()
    metrics.record({"a": parse(page(0), 0.0), "b": parse(page(0), 0.0)}, {}, now=0.0)
    metrics.record({"a": parse(page(100), 10.0)}, {"b": "connection refused"}, now=10.0)
    assert metrics.errors() == {"b": "connection refused"}
    assert metrics.backends() == {"a": {"objects": True}}
    assert metrics.series("produce_bytes") == [(10.0, 10.0)]
    # b answers again: its rate is over the 20 s since its last good scrape
    metrics.record({"a": parse(page(100), 20.0), "b": parse(page(2000), 20.0)}, {}, now=20.0)
    assert metrics.errors() == {}
    assert metrics.series("produce_bytes")[-1] == (20.0, 100.0)


def test_urls_no_longer_listed_are_forgotten() -> None:
    metrics = sampler()
    metrics.record({"a": parse(page(0), 0.0)}, {"b": "timed out"}, now=0.0)
    metrics.record({"c": parse(page(0), 1.0)}, {}, now=1.0)
    assert metrics.errors() == {} and set(metrics.backends()) == {"c"}


def test_lag_series_per_group() -> None:
    metrics = sampler()
    metrics.record({"a": parse(page(lag={"g": 3, "h": 1}), 0.0)}, {}, now=0.0)
    metrics.record({"a": parse(page(lag={"g": 5}), 5.0)}, {}, now=5.0)
    assert metrics.lag("g") == [(0.0, 3.0), (5.0, 5.0)]
    assert metrics.lag("h") == [(0.0, 1.0)]
    assert metrics.latest_lag("g") == 5 and metrics.latest_lag("h") is None
    assert metrics.partition_lag("g") == {("t", 0): 5.0}
    assert metrics.lag("nobody") == []


def test_history_is_bounded_and_old_groups_dropped() -> None:
    metrics = sampler(history=3)
    for i in range(10):
        lag = {"g": i, "once": 1} if i == 0 else {"g": i}
        metrics.record({"a": parse(page(produced=i * 100, lag=lag), float(i))}, {}, now=float(i))
    assert metrics.series("produce_bytes") == [(7.0, 100.0), (8.0, 100.0), (9.0, 100.0)]
    assert metrics.lag("g") == [(7.0, 7.0), (8.0, 8.0), (9.0, 9.0)]
    assert metrics.lag("once") == []


def test_readers_get_copies() -> None:
    metrics = sampler()
    metrics.record({"a": parse(page(0), 0.0)}, {}, now=0.0)
    metrics.backends()["a"]["objects"] = False
    metrics.errors()["x"] = "y"
    assert metrics.backends() == {"a": {"objects": True}} and metrics.errors() == {}


def test_a_url_list_that_fails_is_an_error_and_keeps_the_state() -> None:
    def broken() -> list[str]:
        raise OSError("etcd unreachable")

    metrics = MetricsSampler(broken)
    metrics.record({"a": parse(page(0), 0.0)}, {}, now=0.0)
    metrics.sample_once()
    assert metrics.errors() == {"": "cannot list the brokers' metrics URLs: etcd unreachable"}
    assert set(metrics.backends()) == {"a"}


# -- over HTTP -----------------------------------------------------------------------------------


class MetricsServer:
    """Serves `pages` in turn (the last one again and again) on /metrics, behind basic auth,
    and answers 500 on /broken."""

    def __init__(self, pages: list[str], auth: tuple[str, str]) -> None:
        self.pages = pages
        self.served = 0
        expected = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                if self.path != "/metrics":
                    self.send_response(500)
                    self.end_headers()
                    return
                body = outer.pages[min(outer.served, len(outer.pages) - 1)].encode()
                outer.served += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    pages = [page(produced=0, puts=0, lag={"g": 4}), page(produced=1e6, puts=50, lag={"g": 2})]
    server = MetricsServer(pages, ("console", "s3cret"))
    yield server
    server.close()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_sample_once_over_http(server: MetricsServer) -> None:
    urls = [f"{server.url}/metrics", f"{server.url}/broken", "http://127.0.0.1:1/metrics"]
    metrics = MetricsSampler(lambda: urls, timeout=5.0, auth=("console", "s3cret"))
    metrics.sample_once()
    metrics.sample_once()
    errors = metrics.errors()
    assert set(errors) == set(urls[1:])
    assert errors[urls[1]].startswith("HTTP 500")
    assert metrics.backends() == {urls[0]: {"objects": True}}
    (_, produced), *_ = metrics.series("produce_bytes")
    assert produced > 0 and metrics.rates()["s3_put"] > 0
    assert metrics.latest_lag("g") == 2


def test_wrong_credentials_are_an_error(server: MetricsServer) -> None:
    url = f"{server.url}/metrics"
    metrics = MetricsSampler(lambda: [url], auth=("console", "wrong"))
    metrics.sample_once()
    assert metrics.errors() == {url: "HTTP 401 Unauthorized"}


def test_the_thread_samples_until_stopped(server: MetricsServer) -> None:
    metrics = MetricsSampler(
        lambda: [f"{server.url}/metrics"], interval=0.05, auth=("console", "s3cret")
    )
    metrics.start()
    try:
        wait_until(lambda: len(metrics.series("produce_bytes")) >= 3)
    finally:
        metrics.stop()
    assert not any(t.name == "console-metrics" for t in threading.enumerate())
    assert metrics.lag("g")[0][1] == 4.0 and metrics.lag("g")[-1][1] == 2.0
    # the first rate is the step between the two pages; later ones see no change
    assert metrics.series("produce_bytes")[0][1] > 0
    assert metrics.series("produce_bytes")[-1][1] == 0.0
