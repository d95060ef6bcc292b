"""Prometheus metrics of every broker process, aggregated by the supervisor's /metrics.

prometheus-client's multiprocess mode: each process writes its samples to files under
``PROMETHEUS_MULTIPROC_DIR`` (set by the supervisor, in the runtime directory, before any child
starts), and the supervisor's collector reads them all. Import this module only after that
variable is set, since prometheus-client picks its storage when first imported.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("kafscale_requests", "Kafka requests handled", ["api"])
REQUESTS_ABANDONED = Counter(
    "kafscale_requests_abandoned",
    "Requests cancelled because their client went away (parked fetches)",
    ["api"],
)
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
CONNECTIONS_REFUSED = Counter(
    "kafscale_connections_refused",
    "Connections closed right after accept: their address was at KAFSCALE_MAX_CONNECTIONS_PER_IP",
    ["limit"],
)
ACCEPT_PAUSED = Gauge(
    "kafscale_accept_paused",
    "1 while the listener accepts nothing: it is at KAFSCALE_MAX_CONNECTIONS",
    multiprocess_mode="livemax",
)
ACCEPT_PAUSES = Counter(
    "kafscale_accept_pauses", "Times the listener stopped accepting at KAFSCALE_MAX_CONNECTIONS"
)
CONNECTIONS_CLOSED = Counter(
    "kafscale_connections_closed",
    "Connections the broker closed for a limit (idle: KAFSCALE_CONNECTIONS_MAX_IDLE_MS)",
    ["reason"],
)
TLS_HANDSHAKE_FAILURES = Counter(
    "kafscale_tls_handshake_failures",
    "TLS handshakes that failed or timed out, by listener",
    ["listener"],
)
TLS_RELOADS = Counter(
    "kafscale_tls_reloads",
    "TLS certificate files reloaded after a change, by result (loaded, or failed: the "
    "previous certificate stays)",
    ["result"],
)
SASL_AUTHENTICATIONS = Counter(
    "kafscale_sasl_authentications",
    "SASL authentications (and re-authentications) by listener, mechanism and result",
    ["listener", "mechanism", "result"],
)
AUTHORIZATION_DENIED = Counter(
    "kafscale_authorization_denied",
    "Operations an ACL denied (KAFSCALE_AUTHORIZER=acl), by API",
    ["api"],
)
CONNECTIONS_THROTTLED = Counter(
    "kafscale_connections_throttled",
    "Times a connection was not read because it held its in-flight limit (requests or bytes)",
    ["limit"],
)
CONNECTION_HELD_BYTES = Gauge(
    "kafscale_connection_held_bytes",
    "Bytes held for client connections: requests read and not answered, responses not yet "
    "sent, frames partly received (sampled every second)",
    multiprocess_mode="livesum",
)
CHILD_RESTARTS = Counter("kafscale_child_restarts", "Child processes respawned", ["role"])
CHILD_HANGS = Counter(
    "kafscale_child_hangs",
    "Child processes killed for not answering liveness pings (KAFSCALE_CHILD_HANG_TIMEOUT_MS)",
    ["role"],
)
BACKEND_OUTAGES = Counter(
    "kafscale_backend_outages",
    "Times a process found a backend unreachable and began refusing calls to it until it answers",
    ["backend"],
)
CHILDREN_READY = Gauge(
    "kafscale_children_ready", "Child processes up and answering pings", multiprocess_mode="liveall"
)
BACKEND_UP = Gauge(
    "kafscale_backend_up",
    "Whether a backend answered its last health check",
    ["backend"],
    multiprocess_mode="liveall",
)

# -- write path ----------------------------------------------------------------------------------
RECORDS_PRODUCED = Counter("kafscale_produced_records", "Records appended to partition buffers")
BYTES_PRODUCED = Counter("kafscale_produced_bytes", "Batch bytes appended to partition buffers")
BATCHES_REJECTED = Counter("kafscale_batches_rejected", "Produce batches refused", ["reason"])
READ_FAULTS = Counter(
    "kafscale_read_faults",
    "Stored batches or segments a read path could not read (that request or segment got an error)",
    ["path"],
)
BUFFER_BYTES = Gauge(
    "kafscale_buffer_bytes",
    "Unflushed bytes held by a shard",
    ["shard"],
    multiprocess_mode="livesum",
)
S3_HEALTHY = Gauge(
    "kafscale_s3_healthy",
    "1 while a shard accepts produce (S3 healthy)",
    ["shard"],
    multiprocess_mode="livemin",
)
FLUSHES = Counter("kafscale_flushes", "Sealed partition buffers committed (write-ahead chunks)")
FLUSH_BYTES = Counter("kafscale_flush_bytes", "Bytes of committed write-ahead chunks")
FLUSH_SECONDS = Histogram(
    "kafscale_flush_duration_seconds",
    "Seal-to-commit time of a flush",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
FLUSH_ERRORS = Counter("kafscale_flush_errors", "Flushes that failed", ["kind"])
WAL_CUTS = Counter("kafscale_wal_cuts", "Flush cycles cut, by trigger", ["reason"])
WAL_OBJECTS = Counter("kafscale_wal_objects", "Write-ahead objects uploaded")
WAL_OBJECT_ENTRIES = Histogram(
    "kafscale_wal_object_entries",
    "Partition entries per write-ahead object",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
COMPACTIONS = Counter("kafscale_compactions", "Spec segments built from chunks and committed")
COMPACTION_BYTES = Counter("kafscale_compaction_bytes", "Bytes of the segments compaction wrote")
COMPACTION_FAILURES = Counter(
    "kafscale_compaction_failures", "Compaction jobs (loads, seals) that failed", ["kind"]
)
COMPACTION_MERGES = Counter(
    "kafscale_compaction_merges", "Merged write-ahead objects the compactor wrote and committed"
)
COMPACTION_MERGED_BYTES = Counter(
    "kafscale_compaction_merged_bytes", "Bytes of held chunks moved into merged objects"
)
CLEANINGS = Counter(
    "kafscale_cleanings",
    "Log cleanings of compacted partitions, by outcome (committed, refused, failed)",
    ["outcome"],
)
CLEANER_BYTES = Counter(
    "kafscale_cleaner_bytes", "Segment bytes the log cleaner read and wrote", ["direction"]
)
COMPACTION_HELD_BYTES = Gauge(
    "kafscale_compaction_held_bytes",
    "Bytes of uncompacted chunks the compactor holds (KAFSCALE_COMPACTION_BUFFER_BYTES bounds it)",
    multiprocess_mode="livesum",
)
S3_PUT_SECONDS = Histogram(
    "kafscale_s3_put_duration_seconds",
    "Object store PUT latency",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
S3_ERRORS = Counter("kafscale_s3_errors", "Object store operations that failed", ["operation"])

# -- read path -----------------------------------------------------------------------------------
FETCH_BYTES = Counter("kafscale_fetch_bytes", "Record batch bytes returned to Fetch requests")
FETCH_WAIT_SECONDS = Histogram(
    "kafscale_fetch_wait_seconds",
    "How long fetches waited for data (long polling) before they were answered",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
FETCHES_WAITING = Gauge(
    "kafscale_fetches_waiting",
    "Fetches parked until data arrives",
    ["shard"],
    multiprocess_mode="livesum",
)
CACHE_LOOKUPS = Counter(
    "kafscale_cache_lookups",
    "Read-path cache lookups by layer (segment = L1, index = L2) and result (hit or miss)",
    ["layer", "result"],
)
CACHE_BYTES = Gauge(
    "kafscale_cache_bytes",
    "Bytes held by a shard's read-path cache",
    ["layer", "shard"],
    multiprocess_mode="livesum",
)
READAHEADS = Counter("kafscale_readahead_segments", "Segments prefetched by read-ahead", ["result"])
S3_READ_HEALTHY = Gauge(
    "kafscale_s3_read_healthy",
    "1 while a shard's reads from the object store succeed",
    ["shard"],
    multiprocess_mode="livemin",
)
S3_REQUESTS = Counter(
    "kafscale_s3_requests",
    "Object store requests by operation (get, put, list, ...)",
    ["operation"],
)
S3_GET_BYTES = Counter("kafscale_s3_get_bytes", "Bytes read from the object store")
S3_GET_SECONDS = Histogram(
    "kafscale_s3_get_duration_seconds",
    "Object store GET latency",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

# -- consumer groups -----------------------------------------------------------------------------
GROUPS = Gauge(
    "kafscale_groups",
    "Consumer groups by type (classic, consumer: KIP-848) and state",
    ["type", "state"],
    multiprocess_mode="livemax",
)
GROUP_MEMBERS = Gauge(
    "kafscale_group_members",
    "Members of consumer groups by group type",
    ["type"],
    multiprocess_mode="livemax",
)
REBALANCES = Counter(
    "kafscale_group_rebalances", "Completed rebalances of classic groups (join phases)"
)
CONSUMER_GROUP_REBALANCES = Counter(
    "kafscale_consumer_group_rebalances",
    "Group epoch bumps of consumer (KIP-848) groups: each makes their members reconcile",
)
CONSUMER_GROUP_HEARTBEATS = Counter(
    "kafscale_consumer_group_heartbeats",
    "ConsumerGroupHeartbeat requests answered, by error (NONE: served)",
    ["error"],
)
CONSUMER_GROUP_FENCED_MEMBERS = Counter(
    "kafscale_consumer_group_fenced_members",
    "Members removed from consumer groups, by reason (left, session timeout, rebalance timeout)",
    ["reason"],
)
OFFSET_COMMITS = Counter("kafscale_offset_commits", "Partition offsets committed by groups")
CONSUMER_LAG = Gauge(
    "kafscale_consumer_lag",
    "High watermark minus the group's committed offset",
    ["group", "topic", "partition"],
    multiprocess_mode="livemax",
)
RETENTION_DELETED = Counter(
    "kafscale_retention_deleted_segments", "Segments deleted by retention.ms/retention.bytes"
)
