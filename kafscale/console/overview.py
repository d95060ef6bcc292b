"""The overview page: brokers (live, partitions owned), S3 and etcd health as the brokers report
it, charts of produce/fetch bytes, requests and S3 requests over the sampled window, and the
estimated S3 bill at the current rates plus the bytes stored."""

from __future__ import annotations

from aiohttp import web

from kafscale.console import charts, cost
from kafscale.console.web import call, console, kafka, render
from kafscale.kafka_admin import AdminError


async def overview(request: web.Request) -> web.StreamResponse:
    state = console(request)
    error = None
    cluster = None
    try:
        cluster = await call(kafka(request).cluster, None, state.settings.sample_seconds)
    except AdminError as exc:
        error = str(exc)
    snapshot = state.storage.snapshot() if state.storage is not None else None
    stored = {b.node_id: b for b in snapshot.brokers} if snapshot is not None else {}
    metrics = state.metrics
    graphs = []
    estimate = None
    backends: dict[str, dict[str, bool]] = {}
    scrape_errors: dict[str, str] = {}
    if metrics is not None:
        graphs = [
            charts.line_chart(
                {
                    "produce": metrics.series("produce_bytes"),
                    "fetch": metrics.series("fetch_bytes"),
                },
                title="Produce and fetch",
                unit="B/s",
            ),
            charts.line_chart(
                {
                    "produce": metrics.series("produce_requests"),
                    "fetch": metrics.series("fetch_requests"),
                    "all": metrics.series("requests"),
                },
                title="Kafka requests",
                unit="req/s",
            ),
            charts.line_chart(
                {
                    "PUT": metrics.series("s3_put"),
                    "GET": metrics.series("s3_get"),
                },
                title="S3 requests",
                unit="req/s",
            ),
        ]
        backends = metrics.backends()
        scrape_errors = metrics.errors()
        estimate = cost.estimate(
            metrics.s3_rates(), snapshot.total_bytes if snapshot is not None else 0
        )
    return render(
        request,
        "overview.html",
        cluster=cluster,
        partitions=sum(len(t.partitions) for t in cluster.topics.values()) if cluster else -1,
        error=error,
        snapshot=snapshot,
        stored=stored,
        graphs=graphs,
        backends=backends,
        scrape_errors=scrape_errors,
        estimate=estimate,
        rates=metrics.rates() if metrics is not None else {},
    )


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/", overview)
