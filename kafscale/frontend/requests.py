"""One request frame in, one response frame (or none) out: version checks and dispatch.

Decisions, in Kafka's order:
1. An API key Kafka does not define cannot be answered in any format: ``UnknownApi``, and the
   connection closes.
2. ApiVersions at a version we do not serve: the KIP-511 v0 answer with UNSUPPORTED_VERSION.
3. Produce v0-v2 (advertised, as Kafka 4 does, for old librdkafka builds): every partition gets
   UNSUPPORTED_VERSION (``kafscale.protocol.legacy_produce``).
4. A version Kafka never defined for a known API: ``MalformedRequest`` (no format to answer in).
5. A known API we do not implement, or a version outside our range: that version's response
   with UNSUPPORTED_VERSION in its error fields, so the client sees an error, not a hang-up.
6. Otherwise decode (trailing bytes ignored, see ``codec``) and call the handler. Decoding checks
   the frame's structure first (``kafscale.protocol.bounds``): what does not parse, or holds more
   than ``KAFSCALE_MAX_REQUEST_ELEMENTS`` array elements or ``KAFSCALE_MAX_DECODED_REQUEST_BYTES``
   of fields, raises a DecodeError, and the connection closes with a log line saying why (Kafka:
   InvalidRequestException, closed).
"""

from __future__ import annotations

import logging

from kafscale.frontend.context import Broker, Encoded, RequestContext, Session
from kafscale.frontend.handlers import api_versions, produce
from kafscale.protocol import codec, legacy_produce
from kafscale.protocol.errors import ErrorCode, MalformedRequest

log = logging.getLogger(__name__)

PRODUCE = 0


Response = bytes | list[bytes | memoryview]


async def process(
    broker: Broker, frame: bytes, peer: str, session: Session | None = None
) -> Response | None:
    """The response frame to ``frame`` (whole, or in pieces to write in order), None if the
    protocol sends none. Raises DecodeError. ``session``: the connection's (who the client is);
    the connection has already admitted the request (``Session.auth.admit``)."""
    api_key, version, correlation_id = codec.peek_header(frame)
    name = codec.api_name(api_key)
    api = broker.apis.get(api_key)
    if api_key == api_versions.API_KEY and (api is None or not api.supports(version)):
        log.info(
            "ApiVersions version not supported; answering in v0 (KIP-511)",
            extra={"version": version, "peer": peer},
        )
        return codec.encode_response(
            correlation_id, api_versions.unsupported_version_response(broker.apis)
        )
    if api_key == PRODUCE and 0 <= version < produce.FIRST_SERVED_VERSION:
        log.warning(
            "refusing Produce v0-v2 (removed in Kafka 4, KIP-896)",
            extra={"version": version, "peer": peer},
        )
        return legacy_produce.refuse(frame)
    schema = codec.request_schema(api_key, version)
    if schema is None:
        raise MalformedRequest(f"{name} has no version {version}")
    if api is None or not api.supports(version):
        log.warning(
            "request for an unsupported API or version",
            extra={"api": name, "version": version, "peer": peer},
        )
        response_schema = codec.response_schema(api_key, version)
        if response_schema is None:  # pragma: no cover - kio pairs every request with a response
            raise MalformedRequest(f"{name} v{version} has no response format")
        response = codec.error_response(response_schema, ErrorCode.unsupported_version)
        return codec.encode_response(correlation_id, response)
    header, request = codec.decode_request(frame, schema, broker.config)
    context = RequestContext(broker, header, peer, session if session is not None else Session())
    response = await api.handle(context, request)
    if response is None:
        return None
    if isinstance(response, Encoded):
        return response.chunks
    return codec.encode_response(correlation_id, response)
