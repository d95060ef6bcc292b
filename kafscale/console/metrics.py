"""The brokers' /metrics sampled over time: the rates, backend health and consumer lag the
console's charts draw (docs/design/console.md, section 1).

The pure part reads one scrape into numbers (`parse`) and turns two scrapes of one broker into
rates (`counter_rates`); `MetricsSampler` does the HTTP and keeps the history.

- Every rate series is per second, summed over the brokers: ``produce_bytes``, ``fetch_bytes``,
  ``network_in_bytes``, ``network_out_bytes``, ``requests`` (every API), ``produce_requests``,
  ``fetch_requests`` and ``s3_<operation>`` (``s3_put``, ``s3_get``, ``s3_head``, ``s3_list``,
  ``s3_delete``, and any other operation a broker reports).
- Counters live per broker and restart at 0 with it. A broker any of whose counters went down
  between two scrapes restarted: the increase of each of its counters over that interval is
  the counter's new value (what it counted since the restart; what it counted before, after
  the earlier scrape, is lost). Prometheus's ``rate()`` does the same per counter; all of a
  broker's counters restart together, so one going down marks them all. No rate is negative.
- A broker that does not answer adds nothing to that sample's sums and has its error in
  `errors()`; the next scrape that succeeds measures its rate since its last good one.
- History is bounded: `history` points a series; a group's lag series is dropped once it has no
  point left in that window.
- One lock guards the shared state; readers get copies.
"""

from __future__ import annotations

import base64
import logging
import math
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

PRODUCE_BYTES = "produce_bytes"
FETCH_BYTES = "fetch_bytes"
NETWORK_IN_BYTES = "network_in_bytes"
NETWORK_OUT_BYTES = "network_out_bytes"
REQUESTS = "requests"
S3_OPERATIONS = ("put", "get", "head", "list", "delete")  # kafscale.storage.metered's labels
REQUEST_APIS = ("produce", "fetch")  # kafscale_requests_total's api label (kio's names)
_TOTALS = (PRODUCE_BYTES, FETCH_BYTES, NETWORK_IN_BYTES, NETWORK_OUT_BYTES, REQUESTS)
RATE_SERIES = (
    *_TOTALS,
    *(f"{a}_requests" for a in REQUEST_APIS),
    *(f"s3_{op}" for op in S3_OPERATIONS),
)
# Unlabelled counters (kafscale/metrics.py; prometheus-client adds ``_total``) -> rate series.
_COUNTERS = {
    "kafscale_produced_bytes_total": PRODUCE_BYTES,
    "kafscale_fetch_bytes_total": FETCH_BYTES,
    "kafscale_network_bytes_in_total": NETWORK_IN_BYTES,
    "kafscale_network_bytes_out_total": NETWORK_OUT_BYTES,
}
MAX_SCRAPE_BYTES = 64 << 20  # 10,000 partitions' lag lines for a few groups fit many times

LagKey = tuple[str, str, int]  # group, topic, partition
Point = tuple[float, float]  # unix seconds, value


@dataclass(frozen=True)
class Scrape:
    """One broker's /metrics at `time` (unix seconds), read into the numbers the console uses."""

    time: float
    counters: Mapping[str, float]  # rate series name -> counter value
    backends: Mapping[str, bool]  # kafscale_backend_up: False if any process says 0
    lag: Mapping[LagKey, float]  # kafscale_consumer_lag


def parse(text: str, scraped_at: float) -> Scrape:
    """Read a Prometheus text-format page taken at `scraped_at` (unix seconds); raises
    ValueError if it is not one. The supervisor aggregates its processes (multiprocess mode):
    counters come summed, but ``kafscale_backend_up`` (``liveall``) has one sample per process
    (a ``pid`` label)."""
    counters: dict[str, float] = {}
    backends: dict[str, bool] = {}
    lag: dict[LagKey, float] = {}

    def add(name: str, value: float) -> None:
        counters[name] = counters.get(name, 0.0) + value

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name in _COUNTERS:
                add(_COUNTERS[name], value)
            elif name == "kafscale_requests_total":
                add(REQUESTS, value)
                if labels.get("api") in REQUEST_APIS:
                    add(f"{labels['api']}_requests", value)
            elif name == "kafscale_s3_requests_total" and labels.get("operation"):
                add(f"s3_{labels['operation']}", value)
            elif name == "kafscale_backend_up" and "backend" in labels:
                backend = labels["backend"]
                backends[backend] = backends.get(backend, True) and value == 1
            elif name == "kafscale_consumer_lag":
                try:
                    key = (labels["group"], labels["topic"], int(labels["partition"]))
                except (KeyError, ValueError):
                    continue
                lag[key] = max(lag.get(key, -math.inf), value)
    return Scrape(scraped_at, counters, backends, lag)


def counter_rates(before: Scrape, after: Scrape) -> dict[str, float]:
    """Per-second increase of each counter of `after` since `before` (the same broker); empty
    if `after` is not later. If any counter went down, the broker restarted between the two:
    every increase is then the counter's new value."""
    seconds = after.time - before.time
    if seconds <= 0:
        return {}
    restarted = any(after.counters.get(k, 0.0) < v for k, v in before.counters.items())
    rates = {}
    for name, value in after.counters.items():
        increase = value if restarted else value - before.counters.get(name, 0.0)
        rates[name] = increase / seconds
    return rates


def merge_lag(scrapes: Sequence[Scrape]) -> dict[LagKey, float]:
    """Lag per (group, topic, partition) over brokers: the highest any reports (a group's
    coordinator reports it; a broker that was its coordinator before may still hold a value)."""
    merged: dict[LagKey, float] = {}
    for scrape in scrapes:
        for key, value in scrape.lag.items():
            merged[key] = max(merged.get(key, -math.inf), value)
    return merged


def lag_by_group(lag: Mapping[LagKey, float]) -> dict[str, float]:
    """A group's lag: the sum over its partitions."""
    groups: dict[str, float] = {}
    for (group, _, _), value in lag.items():
        groups[group] = groups.get(group, 0.0) + value
    return groups


def s3_request_rates(rates: Mapping[str, float]) -> dict[str, float]:
    """The ``s3_<operation>`` rates as {operation: requests per second} (for cost.estimate)."""
    return {name[len("s3_") :]: value for name, value in rates.items() if name.startswith("s3_")}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would carry the Authorization header to wherever it points: refuse it.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(
    url: str,
    *,
    timeout: float,
    auth: tuple[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> str:
    """GET one /metrics page; raises OSError (urllib's errors) or ValueError."""
    if not url.startswith(("http://", "https://")):
        raise ValueError("not an http:// or https:// URL")
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
        request.add_header("Authorization", f"Basic {token}")
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    with opener.open(request, timeout=timeout) as response:
        body: bytes = response.read(MAX_SCRAPE_BYTES + 1)
    if len(body) > MAX_SCRAPE_BYTES:
        raise ValueError(f"the page is over {MAX_SCRAPE_BYTES >> 20} MiB")
    return body.decode("utf-8")


def _describe(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


class MetricsSampler:
    """Scrapes `urls()` every `interval` seconds in a daemon thread (`start`/`stop`), or once
    per `sample_once` call. `auth` is HTTP basic (user, password); `ca_file` a PEM bundle to
    trust for https URLs."""

    def __init__(
        self,
        urls: Callable[[], Sequence[str]],
        *,
        interval: float = 5.0,
        history: int = 360,
        timeout: float = 5.0,
        auth: tuple[str, str] | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.urls = urls
        self.interval = interval
        self.history = history
        self.timeout = timeout
        self._auth = auth
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._lock = threading.Lock()
        self._previous: dict[str, Scrape] = {}  # last good scrape of each URL
        self._rates: dict[str, deque[Point]] = {n: deque(maxlen=history) for n in RATE_SERIES}
        self._latest_rates: dict[str, float] = {}
        self._lag: dict[str, deque[Point]] = {}
        self._latest_lag: dict[LagKey, float] = {}
        self._latest_group_lag: dict[str, float] = {}
        self._backends: dict[str, dict[str, bool]] = {}
        self._errors: dict[str, str] = {}
        self._times: deque[float] = deque(maxlen=history)
        self._last_sample_time: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- I/O -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="console-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one scrape's `timeout`)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            try:
                self.sample_once()
            except Exception:
                log.exception("metrics sample failed")
            if self._stopping.wait(self.interval):
                return

    def sample_once(self) -> None:
        """Scrape every URL (concurrently) and record the results."""
        try:
            urls = list(dict.fromkeys(self.urls()))
        except Exception as exc:
            with self._lock:  # keep every broker's state: the next listing may well work
                self._errors[""] = f"cannot list the brokers' metrics URLs: {_describe(exc)}"
            return
        scrapes: dict[str, Scrape] = {}
        failures: dict[str, str] = {}
        if urls:
            with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
                for url, outcome in zip(urls, pool.map(self._scrape, urls), strict=True):
                    if isinstance(outcome, Scrape):
                        scrapes[url] = outcome
                    else:
                        failures[url] = outcome
        self.record(scrapes, failures)

    def _scrape(self, url: str) -> Scrape | str:
        try:
            text = fetch(url, timeout=self.timeout, auth=self._auth, context=self._context)
            return parse(text, time.time())
        except Exception as exc:
            return _describe(exc)

    # -- state -----------------------------------------------------------------------------------

    def record(
        self, scrapes: Mapping[str, Scrape], failures: Mapping[str, str], now: float | None = None
    ) -> None:
        """Add one sample: the URLs that answered and the errors of those that did not. URLs in
        neither are forgotten (no longer listed). `now` (default: the clock) stamps the sums."""
        now = time.time() if now is None else now
        with self._lock:
            listed = set(scrapes) | set(failures)
            for table in (self._previous, self._backends, self._errors):
                for url in set(table) - listed:
                    del table[url]
            self._errors.update(failures)
            for url in failures:
                self._backends.pop(url, None)  # unknown now: errors() says why
            self._times.append(now)
            if scrapes:
                self._record_scrapes(scrapes, now)
            self._prune_groups()

    def _record_scrapes(self, scrapes: Mapping[str, Scrape], now: float) -> None:
        totals: dict[str, float] | None = None
        for url, scrape in scrapes.items():
            self._errors.pop(url, None)
            self._backends[url] = dict(scrape.backends)
            previous = self._previous.get(url)
            self._previous[url] = scrape
            if previous is None:
                continue
            rates = counter_rates(previous, scrape)
            totals = totals if totals is not None else {}
            for name, rate in rates.items():
                totals[name] = totals.get(name, 0.0) + rate
        if totals is not None:
            for name in totals.keys() - self._rates.keys():
                self._rates[name] = deque(maxlen=self.history)
            self._latest_rates = {name: totals.get(name, 0.0) for name in self._rates}
            for name, points in self._rates.items():
                points.append((now, self._latest_rates[name]))
        self._latest_lag = merge_lag(list(scrapes.values()))
        self._latest_group_lag = lag_by_group(self._latest_lag)
        for group, value in self._latest_group_lag.items():
            self._lag.setdefault(group, deque(maxlen=self.history)).append((now, value))
        self._last_sample_time = now

    def _prune_groups(self) -> None:
        oldest = self._times[0]
        for group in [g for g, points in self._lag.items() if points[-1][0] < oldest]:
            del self._lag[group]

    # -- readers ---------------------------------------------------------------------------------

    def series(self, name: str) -> list[Point]:
        """A rate series' points, oldest first; [] for a name never seen."""
        with self._lock:
            return list(self._rates.get(name, ()))

    def rates(self) -> dict[str, float]:
        """Every rate series' latest value; {} until two samples were taken."""
        with self._lock:
            return dict(self._latest_rates)

    def s3_rates(self) -> dict[str, float]:
        """The latest S3 requests per second by operation (``put``, ``get``, ...)."""
        return s3_request_rates(self.rates())

    def backends(self) -> dict[str, dict[str, bool]]:
        """URL -> backend -> up, from each URL's latest scrape (a failing URL is not here)."""
        with self._lock:
            return {url: dict(backends) for url, backends in self._backends.items()}

    def lag(self, group: str) -> list[Point]:
        """A group's total lag (over its partitions) at each sample, oldest first."""
        with self._lock:
            return list(self._lag.get(group, ()))

    def latest_lag(self, group: str) -> int | None:
        """A group's total lag at the latest sample; None if no broker reports it."""
        with self._lock:
            value = self._latest_group_lag.get(group)
        return None if value is None else round(value)

    def partition_lag(self, group: str) -> dict[tuple[str, int], float]:
        """A group's latest lag by (topic, partition)."""
        with self._lock:
            return {(t, p): v for (g, t, p), v in self._latest_lag.items() if g == group}

    def errors(self) -> dict[str, str]:
        """URL -> why its latest scrape failed (key "": the URLs could not be listed)."""
        with self._lock:
            return dict(self._errors)

    @property
    def last_sample_time(self) -> float | None:
        """Unix seconds of the latest sample in which a broker answered."""
        with self._lock:
            return self._last_sample_time
