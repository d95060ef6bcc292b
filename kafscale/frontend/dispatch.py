"""The dispatch table: API key -> handler and the versions we serve.

Only implemented APIs are listed, and ApiVersions advertises exactly this table. Ranges follow
Kafka 4's broker (KIP-896 minimums), widened where maintained clients need older versions.
"""

from __future__ import annotations

from kafscale.frontend.context import Api
from kafscale.frontend.handlers import (
    alter_configs,
    alter_user_scram_credentials,
    api_versions,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_user_scram_credentials,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
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

# Cluster and topic administration (issue 5's operations APIs).
_ADMIN_HANDLERS = (
    (describe_configs, "DescribeConfigs"),
    (alter_configs, "AlterConfigs"),
    (incremental_alter_configs, "IncrementalAlterConfigs"),
    (create_partitions, "CreatePartitions"),
    (describe_cluster, "DescribeCluster"),
    (sasl_handshake, "SaslHandshake"),
    (sasl_authenticate, "SaslAuthenticate"),
    (describe_user_scram_credentials, "DescribeUserScramCredentials"),
    (describe_client_quotas, "DescribeClientQuotas"),
    (describe_acls, "DescribeAcls"),
    (create_acls, "CreateAcls"),
    (delete_acls, "DeleteAcls"),
    (alter_user_scram_credentials, "AlterUserScramCredentials"),
)
APIS.update(
    {
        module.API_KEY: Api(
            module.API_KEY, name, module.MIN_VERSION, module.MAX_VERSION, module.handle
        )
        for module, name in _ADMIN_HANDLERS
    }
)

# Consumer groups and committed offsets: answered by the coordinator process.
_GROUP_HANDLERS = (
    (find_coordinator, "FindCoordinator"),
    (join_group, "JoinGroup"),
    (sync_group, "SyncGroup"),
    (heartbeat, "Heartbeat"),
    (leave_group, "LeaveGroup"),
    (offset_commit, "OffsetCommit"),
    (offset_fetch, "OffsetFetch"),
    (describe_groups, "DescribeGroups"),
    (list_groups, "ListGroups"),
    (delete_groups, "DeleteGroups"),
    (offset_delete, "OffsetDelete"),
)
APIS.update(
    {
        module.API_KEY: Api(
            module.API_KEY, name, module.MIN_VERSION, module.MAX_VERSION, module.handle
        )
        for module, name in _GROUP_HANDLERS
    }
)
