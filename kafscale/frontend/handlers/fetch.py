"""Fetch (key 1), v4-v17 (Kafka 4's range; topics by id from v13).

Each partition is read by the shard that owns it; one request to each shard involved, all at
once. A shard answers when it has ``min_bytes`` for the client or its partitions hit an error,
else it parks the request until data arrives or ``max_wait_ms`` runs out (long polling). When one
shard's answer is already enough, the others are told to answer at once with what they have
(``ReleaseFetch``), so data on one shard is never held back by an idle one. ``min_bytes`` is
judged per shard: data that reaches ``min_bytes`` only when two shards' parts are added up waits
for the deadline (clients default to ``min_bytes`` = 1, where this never arises).

``max_bytes`` bounds the whole response as in Kafka: partitions in request order, the first with
data always gets its first batch whole even when larger, later ones only what still fits.
Record bytes are never decoded: they come from the shards as zero-copy frames and go out as
pieces of the response frame (``kafscale.protocol.fetch``).

Sessions (KIP-227): every answer is sessionless (session id 0), a full response, which every
client accepts; a request naming a session we never created gets FETCH_SESSION_ID_NOT_FOUND.

Leadership (``kafscale.frontend.leaders``): a partition this broker does not lead, or asked for at
another leader epoch, gets NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH and
is not sent to a shard. As Kafka (KIP-951), a NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH answer
names the current leader (the ``current_leader`` tagged field, v12+) and the response carries its
endpoint (``node_endpoints``, v16+).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import Encoded, RequestContext
from kafscale.frontend.leaders import Leaders
from kafscale.ipc import messages
from kafscale.ipc.rpc import Reply, RpcError
from kafscale.metadata.records import TopicRecord
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.errors import ErrorCode
from kafscale.protocol.fetch import (
    NO_LEADER,
    FetchPartition,
    FetchTopic,
    NodeEndpoint,
    encode_fetch_response,
)
from kafscale.security.authorizer import ResourceType

log = logging.getLogger(__name__)

API_KEY = 1
MIN_VERSION, MAX_VERSION = 4, 17
FIRST_TOPIC_ID_VERSION = 13
READ_COMMITTED = 1
SHARD_TIMEOUT_SLACK_S = 30.0  # a cold read may wait on S3 past the client's max wait
NO_SESSION = 0
# Answers that name the current leader (KafkaApis.handleFetchRequest, KIP-951).
REDIRECTED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)

_fetch_ids = itertools.count(1)


@dataclass(slots=True)
class Slot:
    """One partition of the request, in request order, and its answer once known."""

    index: int
    topic: str = ""  # its name, once the topic is known
    shard: int = -1
    result: messages.FetchResult = field(default_factory=messages.FetchResult)
    records: memoryview | None = None


async def handle(ctx: RequestContext, request: Any) -> Encoded:
    version = ctx.version
    session_id = int(getattr(request, "session_id", NO_SESSION))
    snapshot = ctx.broker.view.snapshot
    leaders = Leaders(ctx, snapshot)
    if session_id != NO_SESSION:
        return _encode(ctx, request, [], leaders, ErrorCode.fetch_session_id_not_found)
    topics: list[tuple[Any, list[Slot]]] = []
    entries: dict[int, list[tuple[Slot, messages.FetchEntry]]] = {}
    for topic in request.topics:
        record = _topic(snapshot.topics, snapshot.topics_by_id, topic, version)
        # By name before v13; an unknown topic id has no name to authorize (UNKNOWN_TOPIC_ID).
        name = record.name if record is not None else getattr(topic, "topic", None)
        readable = name is None or authz.allowed(ctx, AclOperation.READ, ResourceType.TOPIC, name)
        slots = []
        for wanted in topic.partitions:
            slot = Slot(int(wanted.partition), record.name if record is not None else "")
            slots.append(slot)
            error = (
                _check(leaders, record, wanted, version)
                if readable
                else ErrorCode.topic_authorization_failed
            )
            if error is not None:
                slot.result = messages.FetchResult(error_code=int(error))
                continue
            assert record is not None
            slot.shard = ctx.broker.shards.owner(record.topic_id, slot.index)
            entry = messages.FetchEntry(
                topic=record.name,
                topic_id=record.topic_id,
                partition=slot.index,
                offset=int(wanted.fetch_offset),
                max_bytes=int(wanted.partition_max_bytes),
                topic_created_ms=record.created_ms,
            )
            entries.setdefault(slot.shard, []).append((slot, entry))
        topics.append((topic, slots))
    if entries:
        await _read(ctx, request, entries)
    _limit(topics, int(request.max_bytes))
    return _encode(ctx, request, topics, leaders, ErrorCode.none)


def _topic(
    by_name: dict[str, TopicRecord], by_id: dict[str, TopicRecord], topic: Any, version: int
) -> TopicRecord | None:
    if version >= FIRST_TOPIC_ID_VERSION:
        return by_id.get(str(topic.topic_id))
    return by_name.get(topic.topic)


def _check(
    leaders: Leaders, record: TopicRecord | None, wanted: Any, version: int
) -> ErrorCode | None:
    if record is None:
        if version >= FIRST_TOPIC_ID_VERSION:
            return ErrorCode.unknown_topic_id
        return ErrorCode.unknown_topic_or_partition
    if not 0 <= wanted.partition < record.partitions:
        return ErrorCode.unknown_topic_or_partition
    current_epoch = int(getattr(wanted, "current_leader_epoch", -1))  # v9+
    return leaders.check(record.name, int(wanted.partition), current_epoch)


async def _read(
    ctx: RequestContext,
    request: Any,
    entries: dict[int, list[tuple[Slot, messages.FetchEntry]]],
) -> None:
    """Ask every shard involved; once the answers so far reach ``min_bytes`` (or carry an error),
    release the shards still waiting."""
    fetch_id = next(_fetch_ids)
    max_wait_ms = max(int(request.max_wait.total_seconds() * 1000), 0)
    min_bytes = int(request.min_bytes)
    timeout = max_wait_ms / 1000 + SHARD_TIMEOUT_SLACK_S
    calls = {
        asyncio.ensure_future(
            ctx.broker.shards.fetch(
                shard,
                messages.Fetch(
                    fetch_id=fetch_id,
                    entries=[entry for _, entry in items],
                    max_bytes=int(request.max_bytes),
                    min_bytes=min_bytes,
                    max_wait_ms=max_wait_ms,
                ),
                timeout,
            )
        ): shard
        for shard, items in entries.items()
    }
    pending = set(calls)
    got, failed, released = 0, False, False
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for call in done:
            shard = calls[call]
            size, error = _take(shard, call, entries[shard])
            got, failed = got + size, failed or error
        if pending and not released and (got >= min_bytes or failed):
            released = True
            for call in pending:
                await ctx.broker.shards.release(calls[call], fetch_id)


def _take(
    shard: int,
    call: asyncio.Future[Reply],
    items: list[tuple[Slot, messages.FetchEntry]],
) -> tuple[int, bool]:
    """Fill the slots from a shard's answer: the bytes it brought, whether a partition failed."""
    try:
        reply = call.result()
    except RpcError as exc:
        log.warning("shard did not answer a fetch", extra={"shard": shard, "error": str(exc)})
        for slot, _ in items:
            slot.result = messages.FetchResult(
                error_code=int(ErrorCode.request_timed_out), message=f"shard {shard}: {exc}"
            )
        return 0, True
    assert isinstance(reply.message, messages.Fetched)
    frames = iter(reply.bulk)
    got, failed = 0, False
    for (slot, _), result in zip(items, reply.message.results, strict=True):
        slot.result = result
        if result.size:
            slot.records = next(frames).buffer
            got += result.size
        # a storage error waits out the deadline (see kafscale.shards.reader), others do not
        failed = failed or result.error_code not in (0, ErrorCode.kafka_storage_error)
    return got, failed


def _limit(topics: list[tuple[Any, list[Slot]]], max_bytes: int) -> None:
    """Drop records beyond the response's ``max_bytes`` (each shard kept within it on its own);
    the first partition with records always keeps them."""
    used = 0
    for _, slots in topics:
        for slot in slots:
            if slot.records is None:
                continue
            if used > 0 and used + len(slot.records) > max_bytes:
                slot.records = None
                continue
            used += len(slot.records)


def _encode(
    ctx: RequestContext,
    request: Any,
    topics: list[tuple[Any, list[Slot]]],
    leaders: Leaders,
    error: ErrorCode,
) -> Encoded:
    read_committed = int(getattr(request, "isolation_level", 0)) == READ_COMMITTED
    out = []
    for topic, slots in topics:
        partitions = []
        for slot in slots:
            result = slot.result
            current_leader = NO_LEADER
            if result.error_code in REDIRECTED and slot.topic:
                leader = leaders.current_leader(slot.topic, slot.index)
                current_leader = (leader.node_id, leader.epoch)
            partitions.append(
                FetchPartition(
                    partition=slot.index,
                    error_code=result.error_code,
                    high_watermark=result.high_watermark,
                    last_stable_offset=result.high_watermark,
                    log_start_offset=result.log_start_offset,
                    aborted_transactions=[] if read_committed else None,
                    records=[slot.records] if slot.records is not None else [],
                    current_leader=current_leader,
                )
            )
            if result.error_code and result.message:
                log.debug(
                    "fetch partition error",
                    extra={
                        "partition": slot.index,
                        "error": ErrorCode(result.error_code).name,
                        "reason": result.message,
                        "peer": ctx.peer,
                    },
                )
        topic_id = getattr(topic, "topic_id", None)
        out.append(
            FetchTopic(
                name=getattr(topic, "topic", "") or "",
                topic_id=topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(int=0),
                partitions=partitions,
            )
        )
    chunks = encode_fetch_response(
        ctx.version,
        ctx.header.correlation_id,
        out,
        error_code=int(error),
        session_id=NO_SESSION,
        node_endpoints=[
            NodeEndpoint(b.node_id, b.host, b.port, b.rack) for b in leaders.node_endpoints()
        ],
    )
    return Encoded(chunks)
