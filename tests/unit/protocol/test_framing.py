import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale import config as configuration
from kafscale.protocol.errors import DecodeError, FrameTooLarge, InvalidFrameSize
from kafscale.protocol.framing import FrameDecoder, encode_frame
from kafscale.protocol.limits import MAX_SASL_REQUEST_BYTES, Limits, max_frame_bytes

FRAMES = [b"\x00\x12\x00\x03" + bytes(range(i, i + 20)) for i in range(5)]  # ApiVersions v3
STREAM = b"".join(encode_frame(frame) for frame in FRAMES)


def limits(request: int, decoded: int) -> Limits:
    return Limits(request, decoded, max_request_elements=1000)


def decoder(limit: int = 1024, decoded: int | None = None) -> FrameDecoder:
    return FrameDecoder(limits(limit, limit if decoded is None else decoded))


def request(api_key: int, version: int, size: int) -> bytes:
    """A frame (with its length prefix) of ``size`` bytes claiming this API version."""
    return encode_frame(struct.pack(">hhi", api_key, version, 1) + b"\0" * (size - 8))


def test_whole_stream_at_once() -> None:
    frames = decoder()
    assert frames.feed(STREAM) == FRAMES
    assert frames.buffered == 0


def test_byte_by_byte() -> None:
    frames = decoder()
    found: list[bytes] = []
    for i in range(len(STREAM)):
        found += frames.feed(STREAM[i : i + 1])
    assert found == FRAMES
    assert frames.buffered == 0


def test_trailing_partial_frame_is_kept_for_later() -> None:
    frames = decoder()
    partial = encode_frame(b"x" * 30)[:17]
    assert frames.feed(STREAM + partial) == FRAMES
    assert frames.buffered == len(partial) - 4
    assert frames.feed(encode_frame(b"x" * 30)[17:]) == [b"x" * 30]
    assert frames.buffered == 0


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_frames(cuts: list[int]) -> None:
    frames = decoder()
    points = [0, *sorted(cuts), len(STREAM)]
    found: list[bytes] = []
    for start, end in itertools.pairwise(points):
        found += frames.feed(STREAM[start:end])
    assert found == FRAMES


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 7])
def test_negative_or_too_small_length_is_rejected(length: int) -> None:
    with pytest.raises(InvalidFrameSize):
        decoder().feed(struct.pack(">i", length))


def test_oversize_length_is_rejected_before_buffering_the_frame() -> None:
    with pytest.raises(FrameTooLarge, match="1025"):
        decoder().feed(struct.pack(">i", 1025))


def test_frame_of_exactly_the_maximum_is_accepted() -> None:
    assert decoder().feed(encode_frame(b"y" * 1024)) == [b"y" * 1024]


def test_good_frames_before_a_bad_length_are_returned_then_it_raises() -> None:
    frames = decoder()
    assert frames.feed(STREAM + struct.pack(">i", -5) + b"garbage") == FRAMES
    with pytest.raises(InvalidFrameSize, match="-5"):
        frames.feed(b"")
    with pytest.raises(InvalidFrameSize):  # and on every call after
        frames.feed(encode_frame(FRAMES[0]))


def test_raise_pending_raises_the_held_back_error_without_more_bytes() -> None:
    frames = decoder()
    frames.raise_pending()  # nothing held back: no error
    assert frames.feed(STREAM + struct.pack(">i", -5)) == FRAMES
    with pytest.raises(InvalidFrameSize, match="-5"):
        frames.raise_pending()


def test_good_frames_before_an_oversize_request_are_returned_then_it_raises() -> None:
    frames = decoder(4096, decoded=64)
    assert frames.feed(STREAM + request(3, 12, 65)) == FRAMES
    with pytest.raises(FrameTooLarge, match="metadata v12 request of 65 bytes"):
        frames.feed(b"")


def test_a_frame_completed_by_the_read_that_brings_a_bad_length_is_returned() -> None:
    frames = decoder()
    first = encode_frame(FRAMES[0])
    assert frames.feed(first[:10]) == []
    assert frames.feed(first[10:] + struct.pack(">i", 3)) == [FRAMES[0]]
    with pytest.raises(InvalidFrameSize):
        frames.feed(b"")


@pytest.mark.parametrize(
    ("api_key", "version", "limit"),
    [
        (3, 12, 64),  # Metadata: decoded whole
        (1, 17, 64),  # Fetch
        (0, 2, 64),  # Produce v0-v2: refused, parsed by hand
        (0, 3, 4096),  # Produce: record batches are opaque
        (0, 11, 4096),
        (11, 9, 4096),  # JoinGroup: group protocol metadata is opaque
        (14, 5, 4096),  # SyncGroup: assignments are opaque
        (4242, 0, 64),  # an API key Kafka does not define
        (3, 400, 64),  # a version Kafka never defined
    ],
)
def test_each_api_is_held_to_its_limit_from_its_first_bytes(
    api_key: int, version: int, limit: int
) -> None:
    assert max_frame_bytes(limits(4096, 64), api_key, version) == limit
    assert decoder(4096, decoded=64).feed(request(api_key, version, limit)) != []
    over = request(api_key, version, limit + 1)
    frames = decoder(4096, decoded=64)
    # Over the request limit: refused on its length; over a smaller one: once the API version
    # arrives. Either way before the body is waited for.
    judged_at = 4 if limit == 4096 else 8
    assert frames.feed(over[: judged_at - 1]) == []
    with pytest.raises(FrameTooLarge, match=f"{limit + 1} .*maximum of {limit} bytes"):
        frames.feed(over[judged_at - 1 : judged_at])


def test_sasl_requests_are_held_to_kafkas_sasl_limit() -> None:
    broker = limits(100 << 20, 1 << 20)
    assert max_frame_bytes(broker, 17, 1) == MAX_SASL_REQUEST_BYTES
    assert max_frame_bytes(broker, 36, 2) == MAX_SASL_REQUEST_BYTES
    with pytest.raises(FrameTooLarge, match=r"sasl\.server\.max\.receive\.size"):
        FrameDecoder(broker).feed(request(17, 1, MAX_SASL_REQUEST_BYTES + 1)[:8])


def test_the_decoded_limit_never_exceeds_the_request_limit() -> None:
    assert max_frame_bytes(limits(1024, 4096), 3, 12) == 1024


def test_the_broker_config_gives_the_limits() -> None:
    config = configuration.load({"KAFSCALE_MAX_DECODED_REQUEST_BYTES": "64KiB"})
    frames = FrameDecoder(config)
    with pytest.raises(FrameTooLarge, match="KAFSCALE_MAX_DECODED_REQUEST_BYTES"):
        frames.feed(request(3, 12, 64 * 1024 + 1)[:8])
    assert max_frame_bytes(config, 0, 9) == config.max_request_bytes == 100 << 20


@given(st.binary(max_size=200))
def test_garbage_parses_or_raises_the_decode_error(data: bytes) -> None:
    frames = decoder(64)
    try:
        found = frames.feed(data)
    except DecodeError:
        return
    if frames._error is not None:  # good frames came before a bad length: raised next
        assert found
        with pytest.raises(DecodeError):
            frames.feed(b"")
        return
    assert sum(len(frame) + 4 for frame in found) + frames.buffered + (
        4 if frames._expected is not None else 0
    ) == len(data)
