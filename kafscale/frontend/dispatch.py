"""The dispatch table: API key -> handler and the versions we serve.

Only implemented APIs are listed, and ApiVersions advertises exactly this table. Ranges follow
Kafka 4's broker (KIP-896 minimums), widened where maintained clients need older versions.
"""

from __future__ import annotations

from kafscale.frontend.context import Api
from kafscale.frontend.handlers import api_versions, metadata

APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(
            metadata.API_KEY,
            "Metadata",
            metadata.MIN_VERSION,
            metadata.MAX_VERSION,
            metadata.handle,
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
