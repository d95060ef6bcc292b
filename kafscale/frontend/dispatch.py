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
    consumer_group_describe,
    consumer_group_heartbeat,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
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

# Each handler module names its API_KEY, MIN_VERSION, MAX_VERSION and ``handle``.
_HANDLERS = (
    # Producing, fetching, metadata and topics.
    (produce, "Produce"),
    (fetch, "Fetch"),
    (list_offsets, "ListOffsets"),
    (offset_for_leader_epoch, "OffsetForLeaderEpoch"),
    (metadata, "Metadata"),
    (create_topics, "CreateTopics"),
    (delete_topics, "DeleteTopics"),
    (delete_records, "DeleteRecords"),
    (init_producer_id, "InitProducerId"),
    (api_versions, "ApiVersions"),
    # Cluster and topic administration, authentication and authorization.
    (describe_configs, "DescribeConfigs"),
    (alter_configs, "AlterConfigs"),
    (incremental_alter_configs, "IncrementalAlterConfigs"),
    (create_partitions, "CreatePartitions"),
    (describe_cluster, "DescribeCluster"),
    (describe_log_dirs, "DescribeLogDirs"),
    (sasl_handshake, "SaslHandshake"),
    (sasl_authenticate, "SaslAuthenticate"),
    (describe_user_scram_credentials, "DescribeUserScramCredentials"),
    (describe_client_quotas, "DescribeClientQuotas"),
    (describe_acls, "DescribeAcls"),
    (create_acls, "CreateAcls"),
    (delete_acls, "DeleteAcls"),
    (alter_user_scram_credentials, "AlterUserScramCredentials"),
    # Consumer groups and committed offsets: answered by the coordinator process.
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
    (consumer_group_heartbeat, "ConsumerGroupHeartbeat"),
    (consumer_group_describe, "ConsumerGroupDescribe"),
)

APIS: dict[int, Api] = {
    module.API_KEY: Api(module.API_KEY, name, module.MIN_VERSION, module.MAX_VERSION, module.handle)
    for module, name in _HANDLERS
}
