"""Requests that decode but that Kafka refuses, found by the live fuzzer
(tests/integration/test_fuzz_live.py): each once ended as an internal error in a handler."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.index import load_request_schema

from kafscale.protocol import codec
from kafscale.protocol.errors import ErrorCode, MalformedRequest
from tests.unit.frontend.test_requests import decode_response, make_broker, process
from tests.unit.protocol.test_codec import request_frame


@pytest.mark.parametrize("version", [10, 11])
@pytest.mark.parametrize(
    ("name", "topic_id"), [(None, None), ("orders", uuid.uuid4())], ids=["null name", "by id"]
)
def test_metadata_v10_v11_name_topics_only_by_name(
    version: int, name: str | None, topic_id: uuid.UUID | None
) -> None:
    """Kafka (KafkaApis): "Topic IDs are not supported in requests for version 10 and 11",
    "Topic name can not be null": InvalidRequestException, the connection closes."""
    schema = load_request_schema(3, version)
    topic = codec.nested(schema, "MetadataRequestTopic")
    request = codec.build(
        schema,
        topics=(topic(topic_id=topic_id, name=name),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with pytest.raises(MalformedRequest, match=f"Metadata v{version}"):
        process(make_broker(), request_frame(request))


def test_delete_topics_v6_naming_a_topic_both_ways_or_neither_is_invalid() -> None:
    schema = load_request_schema(20, 6)
    state = codec.nested(schema, "DeleteTopicState")
    some_id = uuid.uuid4()
    request = codec.build(
        schema,
        topics=(state(name=None, topic_id=None), state(name="orders", topic_id=some_id)),
        timeout=datetime.timedelta(seconds=1),
    )
    frame = process(make_broker(), request_frame(request, correlation_id=9))
    assert frame is not None
    correlation_id, response = decode_response(frame, 20, 6)
    assert correlation_id == 9
    # (kio reads the all-zero UUID as None)
    assert [(r.name, r.topic_id, r.error_code, r.error_message) for r in response.responses] == [
        (
            None,
            None,
            ErrorCode.invalid_request,
            "Neither topic name nor id were specified.",
        ),
        (
            "orders",
            some_id,
            ErrorCode.invalid_request,
            "You may not specify both topic name and topic id.",
        ),
    ]
