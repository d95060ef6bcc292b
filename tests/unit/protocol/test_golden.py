"""Request bytes captured from real clients, decoded as the broker decodes them."""

from kio.index import load_request_schema

from kafscale.protocol import codec

# confluent-kafka 2.16.1 (librdkafka 2.16.0): ApiVersions v3, then Metadata v12 for all topics.
# librdkafka appends three bytes after the Metadata v12 body; Kafka's parser ignores them.
LIBRDKAFKA_API_VERSIONS_V3 = bytes.fromhex(
    "0012000300000001000772646b61666b610017636f6e666c75656e742d6b61666b612d707974686f6e1632"
    "2e31362e312d72646b61666b612d322e31362e3000"
)
LIBRDKAFKA_METADATA_V12_NO_TOPICS = bytes.fromhex("0003000c00000002000772646b61666b610001000000")
LIBRDKAFKA_METADATA_V12_ALL_TOPICS = bytes.fromhex(
    "0003000c00000003000772646b61666b610000000000010000"
)


def test_librdkafka_api_versions() -> None:
    header, request = codec.decode_request(LIBRDKAFKA_API_VERSIONS_V3, load_request_schema(18, 3))
    assert header == codec.RequestHeader(18, 3, 1, "rdkafka")
    assert request.client_software_name == "confluent-kafka-python"
    assert request.client_software_version == "2.16.1-rdkafka-2.16.0"


def test_librdkafka_metadata_v12() -> None:
    schema = load_request_schema(3, 12)
    _, no_topics = codec.decode_request(LIBRDKAFKA_METADATA_V12_NO_TOPICS, schema)
    assert no_topics.topics == ()
    header, all_topics = codec.decode_request(LIBRDKAFKA_METADATA_V12_ALL_TOPICS, schema)
    assert header.correlation_id == 3
    assert all_topics.topics is None
    assert all_topics.allow_auto_topic_creation is False
