"""ConsumerGroupDescribe (key 69), v0-v1: consumer (KIP-848) groups with their epochs, assignor
and members (subscriptions, current and target assignments). A classic group, or none, is
GROUP_ID_NOT_FOUND: the admin client then falls back to DescribeGroups, as with Kafka.

With ACLs on, a group the principal may not DESCRIBE is GROUP_AUTHORIZATION_FAILED and not asked
for; authorized operations (when asked for) are the principal's on the group (KIP-430). Topics are
named from this broker's view; a topic deleted meanwhile keeps its id and an empty name.
"""

from __future__ import annotations

import uuid

from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_describe.v1.response import ConsumerGroupDescribeResponse

from kafscale.frontend import authz
from kafscale.frontend.context import RequestContext
from kafscale.frontend.handlers._groups import describe_permitted, respond, schema
from kafscale.ipc.consumer_groups import (
    ConsumerGroupDescribe,
    ConsumerGroupDescription,
    ConsumerGroupsDescribed,
    TopicIdPartitions,
)
from kafscale.protocol.acls import NOT_REQUESTED
from kafscale.protocol.codec import build, element
from kafscale.protocol.errors import ErrorCode
from kafscale.security.authorizer import ResourceType

API_KEY = 69
MIN_VERSION, MAX_VERSION = 0, 1
CLASSIC_MEMBER, CONSUMER_MEMBER = 0, 1  # MemberType (v1); -1 is unknown


def _failed(group_id: str, error: int) -> ConsumerGroupDescription:
    return ConsumerGroupDescription(group_id, error)


async def handle(
    ctx: RequestContext, request: ConsumerGroupDescribeRequest
) -> ConsumerGroupDescribeResponse:
    groups = await describe_permitted(
        ctx,
        [str(g) for g in request.group_ids],
        ConsumerGroupDescribe,
        ConsumerGroupsDescribed,
        lambda reply: reply.groups,
        _failed,
    )
    names = {t.topic_id: t.name for t in ctx.broker.view.snapshot.topics.values()}
    group_class = element(schema(ctx, API_KEY), "groups")
    member_class = element(group_class, "members")
    assignment_class = element(member_class, "assignment")
    partitions_class = element(assignment_class, "topic_partitions")

    def assignment(partitions: list[TopicIdPartitions]) -> object:
        return build(
            assignment_class,
            topic_partitions=tuple(
                build(
                    partitions_class,
                    topic_id=uuid.UUID(t.topic_id),
                    topic_name=names.get(t.topic_id, ""),
                    partitions=tuple(t.partitions),
                )
                for t in partitions
            ),
        )

    response: ConsumerGroupDescribeResponse = respond(
        ctx,
        API_KEY,
        groups=tuple(
            build(
                group_class,
                error_code=ErrorCode(g.error_code),
                error_message=g.error_message,
                group_id=g.group_id,
                group_state=g.state,
                group_epoch=g.group_epoch,
                assignment_epoch=g.assignment_epoch,
                assignor_name=g.assignor,
                members=tuple(
                    build(
                        member_class,
                        member_id=m.member_id,
                        instance_id=m.instance_id,
                        rack_id=m.rack_id,
                        member_epoch=m.member_epoch,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        subscribed_topic_names=tuple(m.subscribed_topic_names),
                        subscribed_topic_regex=m.subscribed_topic_regex,
                        assignment=assignment(m.assignment),
                        target_assignment=assignment(m.target_assignment),
                        member_type=CLASSIC_MEMBER if m.classic else CONSUMER_MEMBER,
                    )
                    for m in g.members
                ),
                authorized_operations=authz.authorized_operations(
                    ctx, ResourceType.GROUP, g.group_id
                )
                if request.include_authorized_operations and not g.error_code
                else NOT_REQUESTED,
            )
            for g in groups
        ),
    )
    return response
