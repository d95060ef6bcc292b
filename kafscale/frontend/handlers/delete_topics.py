"""DeleteTopics (key 20), v1-v6: by name, and from v6 by topic id.

The coordinator deletes the topic's record and then its objects before answering, so a topic
re-created with the same name starts empty (see ``kafscale.coordinator.topics``).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.protocol.acls import AclOperation
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 20
MIN_VERSION, MAX_VERSION = 1, 6

NO_UUID = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> Any:
    schema = response_schema(API_KEY, ctx.version)
    assert schema is not None
    result_class = nested(schema, "DeletableTopicResult")
    refused = []
    if ctx.version >= 6:
        # As Kafka's ControllerApis: a topic named both ways, or neither, is INVALID_REQUEST.
        for topic in request.topics:
            if (topic.name is None) == (topic.topic_id is None):
                neither = topic.name is None
                refused.append(
                    build(
                        result_class,
                        name=topic.name,
                        topic_id=topic.topic_id or NO_UUID,
                        error_code=ErrorCode.invalid_request,
                        error_message="Neither topic name nor id were specified."
                        if neither
                        else "You may not specify both topic name and topic id.",
                    )
                )
        names = [t.name for t in request.topics if t.name is not None and t.topic_id is None]
        ids = [str(t.topic_id) for t in request.topics if t.name is None and t.topic_id]
    else:
        names, ids = list(request.topic_names), []
    # DELETE on each topic (by id: on the topic the id names; an unknown id is the
    # coordinator's UNKNOWN_TOPIC_ID).
    by_id = ctx.broker.view.snapshot.topics_by_id
    allowed = authz.topics_allowed(
        ctx, AclOperation.DELETE, [*names, *(by_id[i].name for i in ids if i in by_id)]
    )
    for name in [n for n in names if n not in allowed]:
        refused.append(_denied(result_class, name, NO_UUID))
    for topic_id in [i for i in ids if i in by_id and by_id[i].name not in allowed]:
        refused.append(_denied(result_class, None, uuid.UUID(topic_id)))
    names = [n for n in names if n in allowed]
    ids = [i for i in ids if i not in by_id or by_id[i].name in allowed]
    results = await ctx.broker.coordinator.delete_topics(names, ids) if names or ids else []
    responses = tuple(
        build(
            result_class,
            name=r.name,
            topic_id=uuid.UUID(r.topic_id) if r.topic_id else NO_UUID,
            error_code=ErrorCode(r.error_code),
            error_message=r.error_message,
        )
        for r in results
    )
    return build(schema, throttle_time=datetime.timedelta(0), responses=(*refused, *responses))


def _denied(result_class: type[Any], name: str | None, topic_id: uuid.UUID) -> Any:
    """A topic the principal may not DELETE; by id, its name is not told."""
    return build(
        result_class,
        name=name,
        topic_id=topic_id,
        error_code=ErrorCode.topic_authorization_failed,
        error_message=None,
    )
