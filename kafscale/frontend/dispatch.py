"""The dispatch table: API key -> handler and the versions we serve.

Only implemented APIs are listed, and ApiVersions advertises exactly this table. Ranges follow
Kafka 4's broker (KIP-896 minimums), widened where maintained clients need older versions.
"""

from __future__ import annotations

from kafscale.frontend.context import Api
from kafscale.frontend.handlers import (
    api_versions,
    create_topics,
    delete_topics,
    fetch,
    init_producer_id,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
)

APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(produce.API_KEY, "Produce", produce.MIN_VERSION, produce.MAX_VERSION, produce.handle),
        Api(fetch.API_KEY, "Fetch", fetch.MIN_VERSION, fetch.MAX_VERSION, fetch.handle),
        Api(
            list_offsets.API_KEY,
            "ListOffsets",
            list_offsets.MIN_VERSION,
            list_offsets.MAX_VERSION,
            list_offsets.handle,
        ),
        Api(
            offset_for_leader_epoch.API_KEY,
            "OffsetForLeaderEpoch",
            offset_for_leader_epoch.MIN_VERSION,
            offset_for_leader_epoch.MAX_VERSION,
            offset_for_leader_epoch.handle,
        ),
        Api(
            metadata.API_KEY,
            "Metadata",
            metadata.MIN_VERSION,
            metadata.MAX_VERSION,
            metadata.handle,
        ),
        Api(
            create_topics.API_KEY,
            "CreateTopics",
            create_topics.MIN_VERSION,
            create_topics.MAX_VERSION,
            create_topics.handle,
        ),
        Api(
            delete_topics.API_KEY,
            "DeleteTopics",
            delete_topics.MIN_VERSION,
            delete_topics.MAX_VERSION,
            delete_topics.handle,
        ),
        Api(
            init_producer_id.API_KEY,
            "InitProducerId",
            init_producer_id.MIN_VERSION,
            init_producer_id.MAX_VERSION,
            init_producer_id.handle,
        ),
        Api(
            api_versions.API_KEY,
            "ApiVersions",
            api_versions.MIN_VERSION,
            api_versions.MAX_VERSION,
            api_versions.handle,
        ),
    )
}
