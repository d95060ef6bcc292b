"""FindCoordinator (key 10), v0-v6 (batched keys from v4): a group's coordinator is the owner of
its ``__consumer_offsets`` partition (docs/design/scale-out.md, section 7).

The partition is Kafka's ``abs(hashCode(group_id)) % partitions`` (``metadata.group_partition``)
and its owner the broker its leader key names, at its registered address on the request's
listener; both come from this frontend's watched view. While the partition has no owner (being
claimed or handed over) or the topic is not there yet, the answer is COORDINATOR_NOT_AVAILABLE, as
Kafka answers while a coordinator loads: clients retry. The coordinator process decides
authoritatively: a group request that reaches a broker whose view was ahead or behind is answered
NOT_COORDINATOR there.

Transaction coordinators (key type 1) and share groups (2) do not exist here: those keys get
INVALID_REQUEST with a message, so a transactional client fails at once with a reason instead of
retrying a retriable error forever. An empty group id is INVALID_REQUEST too.

As Kafka does, the first group lookup creates the internal topic ``__consumer_offsets``, whatever
``KAFSCALE_AUTO_CREATE_TOPICS`` says, with ``KAFSCALE_OFFSETS_TOPIC_PARTITIONS`` partitions (the
coordinator decides the count: ``kafscale.coordinator.topics``). Its partitions hold no data
(groups and offsets are metadata records); clients see an internal topic, which e.g. regex
subscriptions leave out.

With ACLs on, a group key needs DESCRIBE on the group (Kafka's check), else it is answered
GROUP_AUTHORIZATION_FAILED, per key from v4, whether the group exists or not; only an authorized
lookup creates ``__consumer_offsets``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import group_allowed, respond, schema
from kafscale.frontend.leaders import live_brokers
from kafscale.ipc.messages import TopicSpec
from kafscale.metadata.group_partition import group_partition
from kafscale.metadata.records import BrokerRecord
from kafscale.metadata.topic_names import OFFSETS_TOPIC
from kafscale.metadata.view import Snapshot
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode

API_KEY = 10
MIN_VERSION, MAX_VERSION = 0, 6
GROUP = 0
BATCHED_VERSION = 4


class Found(NamedTuple):
    error: ErrorCode
    message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1


REFUSED = Found(ErrorCode.group_authorization_failed)


async def handle(ctx: RequestContext, request: Any) -> Any:
    key_type = int(getattr(request, "key_type", GROUP))
    keys = request.coordinator_keys if ctx.version >= BATCHED_VERSION else [request.key]
    # Authorization first: a refused key learns nothing, and creates nothing.
    refused = (
        {key for key in dict.fromkeys(keys) if not group_allowed(ctx, AclOperation.DESCRIBE, key)}
        if key_type == GROUP
        else set()
    )
    if key_type == GROUP and any(key and key not in refused for key in keys):
        await _ensure_offsets_topic(ctx)
    snapshot = ctx.broker.view.snapshot
    # At their endpoints on the request's listener; us even before our registration is seen.
    brokers = {b.node_id: b for b in live_brokers(ctx, snapshot.brokers)}
    found = {
        key: REFUSED if key in refused else coordinator(snapshot, brokers, key_type, key)
        for key in keys
    }
    if ctx.version >= BATCHED_VERSION:
        entry = element(schema(ctx, API_KEY), "coordinators")
        return respond(
            ctx,
            API_KEY,
            coordinators=tuple(
                build(
                    entry,
                    key=key,
                    node_id=found[key].node_id,
                    host=found[key].host,
                    port=found[key].port,
                    error_code=found[key].error,
                    error_message=found[key].message,
                )
                for key in request.coordinator_keys
            ),
        )
    one = found[request.key]
    return respond(
        ctx,
        API_KEY,
        error_code=one.error,
        error_message=one.message,
        node_id=one.node_id,
        host=one.host,
        port=one.port,
    )


def coordinator(
    snapshot: Snapshot, brokers: Mapping[int, BrokerRecord], key_type: int, key: str
) -> Found:
    """The coordinator of group ``key`` as ``snapshot`` shows it (``brokers``: by node id)."""
    if key_type != GROUP:
        return Found(ErrorCode.invalid_request, "KafScale coordinates consumer groups only")
    if not key:
        return Found(ErrorCode.invalid_request, "the group id is empty")
    topic = snapshot.topics.get(OFFSETS_TOPIC)
    if topic is None or topic.partitions <= 0:
        return Found(ErrorCode.coordinator_not_available, f"{OFFSETS_TOPIC} is being created")
    partition = group_partition(key, topic.partitions)
    leader = snapshot.leaders.get((OFFSETS_TOPIC, partition))
    broker = brokers.get(leader.owner) if leader is not None else None
    if broker is None:
        return Found(
            ErrorCode.coordinator_not_available,
            f"{OFFSETS_TOPIC}/{partition}, the group's coordinator, has no owner yet",
        )
    return Found(ErrorCode.none, None, broker.node_id, broker.host, broker.port)


async def _ensure_offsets_topic(ctx: RequestContext) -> None:
    """Create ``__consumer_offsets`` unless the view has it; a failure (the coordinator is
    restarting) only means the next lookup tries again, so the lookup is answered anyway."""
    if OFFSETS_TOPIC not in ctx.broker.view.snapshot.topics:
        await ctx.broker.coordinator.create_topics([TopicSpec(name=OFFSETS_TOPIC, partitions=-1)])
