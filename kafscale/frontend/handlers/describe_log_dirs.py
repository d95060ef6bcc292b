"""DescribeLogDirs (key 35), v1-v4: the log dirs of this broker and the partitions in them.

What ``kafka-log-dirs --describe`` and ``Admin.describeLogDirs`` ask each broker. A KafScale
broker has one log dir, the object store location of its data, holding the partitions it leads,
each with the bytes of its committed entries (``kafscale.frontend.log_dirs``, read on a thread).
``offset_lag`` is 0 and ``is_future_key`` false (no replicas, no directory moves). Asked topics
or partitions this broker does not lead are left out, as Kafka leaves out partitions it does not
host. DESCRIBE on the cluster is required: without it the
answer has no dirs and, from v3, CLUSTER_AUTHORIZATION_FAILED. A broker whose metadata store
cannot be read answers its dir with KAFKA_STORAGE_ERROR. docs/design/ecosystem.md, section 3.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import defaultdict

from kio.schema.describe_log_dirs.v1.request import DescribeLogDirsRequest as V1
from kio.schema.describe_log_dirs.v2.request import DescribeLogDirsRequest as V2
from kio.schema.describe_log_dirs.v3.request import DescribeLogDirsRequest as V3
from kio.schema.describe_log_dirs.v4.request import DescribeLogDirsRequest as V4

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.metadata.store import MetadataStoreError
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 35
# v5 (cordoned log dirs) is Kafka 4.3's; offering it makes kafka-python take the broker for a
# 4.3 one, with Produce v13 and ListOffsets v11, which it is not.
MIN_VERSION, MAX_VERSION = 1, 4

log = logging.getLogger(__name__)

Request = V1 | V2 | V3 | V4


async def handle(ctx: RequestContext, request: Request) -> object:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    if not authz.cluster_allowed(ctx, AclOperation.DESCRIBE):
        return _build(schema, ctx.version, ErrorCode.cluster_authorization_failed, ())
    snapshot = ctx.broker.view.snapshot
    led = sorted(
        pid for pid, leader in snapshot.leaders.items() if leader.owner == ctx.broker.node_id
    )
    if request.topics is None:
        wanted = led
    else:
        asked = {(t.topic, int(p)) for t in request.topics for p in t.partitions}
        wanted = [pid for pid in led if pid in asked]
    dirs = ctx.broker.log_dirs
    result = nested(schema, "DescribeLogDirsResult")
    if dirs is None:
        return _build(schema, ctx.version, ErrorCode.none, ())
    topics = None if request.topics is None else {t.topic for t in request.topics}
    log_dir = dirs.log_dir()
    try:
        sizes = await asyncio.to_thread(dirs.sizes, topics)
    except MetadataStoreError as exc:
        log.warning("cannot read partition sizes", extra={"error": str(exc), "peer": ctx.peer})
        failed = build(
            result,
            error_code=ErrorCode.kafka_storage_error,
            log_dir=log_dir.path,
            topics=(),
            **_volume(ctx.version, -1, -1),
        )
        return _build(schema, ctx.version, ErrorCode.none, (failed,))
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, partition in wanted:
        by_topic[topic].append(partition)
    topic_class = nested(schema, "DescribeLogDirsTopic")
    partition_class = nested(schema, "DescribeLogDirsPartition")
    described = build(
        result,
        error_code=ErrorCode.none,
        log_dir=log_dir.path,
        topics=tuple(
            build(
                topic_class,
                name=name,
                partitions=tuple(
                    build(
                        partition_class,
                        partition_index=partition,
                        partition_size=sizes.get((name, partition), 0),
                        offset_lag=0,
                        is_future_key=False,
                    )
                    for partition in partitions
                ),
            )
            for name, partitions in sorted(by_topic.items())
        ),
        **_volume(ctx.version, log_dir.total_bytes, log_dir.usable_bytes),
    )
    return _build(schema, ctx.version, ErrorCode.none, (described,))


def _volume(version: int, total: int, usable: int) -> dict[str, int]:
    return {"total_bytes": total, "usable_bytes": usable} if version >= 4 else {}


def _build(schema: type, version: int, error: ErrorCode, results: tuple[object, ...]) -> object:
    fields: dict[str, object] = {"throttle_time": datetime.timedelta(0), "results": results}
    if version >= 3:
        fields["error_code"] = error
    return build(schema, **fields)
