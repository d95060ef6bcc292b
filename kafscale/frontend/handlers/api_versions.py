"""ApiVersions (key 18), v0-v4: which APIs and versions this broker serves.

KIP-511: a client may send a version newer than ours; we answer in v0 format with
UNSUPPORTED_VERSION and our ranges, and the client retries with the highest version we share.
From v3 the request names the client software; invalid names get INVALID_REQUEST, as in Kafka.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.static.primitive import i16

from kafscale.frontend.context import Api, RequestContext
from kafscale.protocol.codec import build, nested, response_schema
from kafscale.protocol.errors import ErrorCode

API_KEY = 18
MIN_VERSION, MAX_VERSION = 0, 4

# Kafka's ApiVersionsRequest.isValid(): letters, digits, '-' and '.', alphanumeric at both ends.
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def unsupported_version_response(apis: dict[int, Api]) -> ApiVersionsResponseV0:
    """The KIP-511 answer to a version we do not know, always encoded as v0."""
    return ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            ApiVersionV0(
                api_key=i16(api.key),
                min_version=i16(api.min_version),
                max_version=i16(api.max_version),
            )
            for api in sorted(apis.values(), key=lambda api: api.key)
        ),
    )


async def handle(ctx: RequestContext, request: Any) -> Any:
    version = ctx.version
    schema = response_schema(API_KEY, version)
    assert schema is not None
    error = ErrorCode.none
    if version >= 3 and not (
        _SOFTWARE.fullmatch(request.client_software_name)
        and _SOFTWARE.fullmatch(request.client_software_version)
    ):
        error = ErrorCode.invalid_request
    api_keys = tuple(
        build(
            nested(schema, "ApiVersion"),
            api_key=i16(api.key),
            min_version=i16(api.min_version),
            max_version=i16(api.max_version),
        )
        for api in sorted(ctx.broker.apis.values(), key=lambda api: api.key)
    )
    return build(schema, error_code=error, api_keys=api_keys, throttle_time=datetime.timedelta(0))
