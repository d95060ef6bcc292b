"""Prometheus metrics of every broker process, aggregated by the supervisor's /metrics.

prometheus-client's multiprocess mode: each process writes its samples to files under
``PROMETHEUS_MULTIPROC_DIR`` (set by the supervisor, in the runtime directory, before any child
starts), and the supervisor's collector reads them all. Import this module only after that
variable is set, since prometheus-client picks its storage when first imported.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("kafscale_requests", "Kafka requests handled", ["api"])
REQUEST_ERRORS = Counter(
    "kafscale_request_errors", "Requests that closed their connection", ["reason"]
)
REQUEST_SECONDS = Histogram(
    "kafscale_request_duration_seconds",
    "Time to answer a request",
    ["api"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
CONNECTIONS = Gauge("kafscale_connections", "Open client connections", multiprocess_mode="livesum")
BYTES_IN = Counter("kafscale_network_bytes_in", "Request bytes received")
BYTES_OUT = Counter("kafscale_network_bytes_out", "Response bytes sent")
CHILD_RESTARTS = Counter("kafscale_child_restarts", "Child processes respawned", ["role"])
CHILDREN_READY = Gauge(
    "kafscale_children_ready", "Child processes up and answering pings", multiprocess_mode="liveall"
)
BACKEND_UP = Gauge(
    "kafscale_backend_up",
    "Whether a backend answered its last health check",
    ["backend"],
    multiprocess_mode="liveall",
)
