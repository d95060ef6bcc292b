"""DescribeCluster (key 60), v0-v2: cluster id, controller and brokers (KIP-700).

Answered from the watched metadata view, like Metadata: the registered brokers (this one always
included), none of them fenced, and this broker as the controller (a broker answering
DescribeCluster in Kafka names an alive broker). Only broker endpoints can be described
(``endpoint_type`` 2, controllers: UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers). Each
broker is described at its endpoint on the request's listener. Asked for, the cluster's
authorized operations come from ``kafscale.frontend.authz``: the ACLs' grants, or every cluster
operation without an authorizer, as Kafka reports them. As in Kafka, no ACL is needed to ask.
"""

from __future__ import annotations

import datetime
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.leaders import live_brokers
from kafscale.protocol.acls import NOT_REQUESTED
from kafscale.protocol.codec import build, element, response_schema
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 60
MIN_VERSION, MAX_VERSION = 0, 2

BROKERS = 1  # endpoint types (KIP-919)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    snapshot = ctx.broker.view.snapshot
    endpoint_type = int(getattr(request, "endpoint_type", BROKERS))
    common = {
        "throttle_time": datetime.timedelta(0),
        "endpoint_type": endpoint_type,
        "cluster_id": snapshot.cluster_id or "",
        "controller_id": ctx.broker.node_id,
    }
    if endpoint_type != BROKERS:
        return build(
            schema,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message="The target broker only supports endpoint type BROKER (1)",
            brokers=(),
            cluster_authorized_operations=NOT_REQUESTED,
            **common,
        )
    broker_class = element(schema, "brokers")
    brokers = tuple(
        build(
            broker_class,
            broker_id=record.node_id,
            host=record.host,
            port=record.port,
            rack=record.rack,
            is_fenced=False,
        )
        for record in live_brokers(ctx, snapshot.brokers)
    )
    operations = (
        authz.authorized_operations(ctx, ResourceType.CLUSTER, authz.CLUSTER)
        if request.include_cluster_authorized_operations
        else NOT_REQUESTED
    )
    return build(
        schema,
        error_code=ErrorCode.none,
        error_message=None,
        brokers=brokers,
        cluster_authorized_operations=operations,
        **common,
    )
