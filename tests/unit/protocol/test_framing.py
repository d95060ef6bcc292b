import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.protocol.errors import DecodeError, FrameTooLarge, InvalidFrameSize
from kafscale.protocol.framing import FrameDecoder, encode_frame

FRAMES = [b"\x00\x12\x00\x03" + bytes(range(i, i + 20)) for i in range(5)]
STREAM = b"".join(encode_frame(frame) for frame in FRAMES)


def test_whole_stream_at_once() -> None:
    decoder = FrameDecoder(1024)
    assert decoder.feed(STREAM) == FRAMES
    assert decoder.buffered == 0


def test_byte_by_byte() -> None:
    decoder = FrameDecoder(1024)
    frames: list[bytes] = []
    for i in range(len(STREAM)):
        frames += decoder.feed(STREAM[i : i + 1])
    assert frames == FRAMES
    assert decoder.buffered == 0


def test_trailing_partial_frame_is_kept_for_later() -> None:
    decoder = FrameDecoder(1024)
    partial = encode_frame(b"x" * 30)[:17]
    assert decoder.feed(STREAM + partial) == FRAMES
    assert decoder.buffered == len(partial) - 4
    assert decoder.feed(encode_frame(b"x" * 30)[17:]) == [b"x" * 30]
    assert decoder.buffered == 0


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_frames(cuts: list[int]) -> None:
    decoder = FrameDecoder(1024)
    points = [0, *sorted(cuts), len(STREAM)]
    frames: list[bytes] = []
    for start, end in itertools.pairwise(points):
        frames += decoder.feed(STREAM[start:end])
    assert frames == FRAMES


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 7])
def test_negative_or_too_small_length_is_rejected(length: int) -> None:
    with pytest.raises(InvalidFrameSize):
        FrameDecoder(1024).feed(struct.pack(">i", length))


def test_oversize_length_is_rejected_before_buffering_the_frame() -> None:
    decoder = FrameDecoder(1024)
    with pytest.raises(FrameTooLarge, match="1025"):
        decoder.feed(struct.pack(">i", 1025))


def test_frame_of_exactly_the_maximum_is_accepted() -> None:
    assert FrameDecoder(1024).feed(encode_frame(b"y" * 1024)) == [b"y" * 1024]


@given(st.binary(max_size=200))
def test_garbage_parses_or_raises_the_decode_error(data: bytes) -> None:
    decoder = FrameDecoder(64)
    try:
        frames = decoder.feed(data)
    except DecodeError:
        return
    assert sum(len(frame) + 4 for frame in frames) + decoder.buffered + (
        4 if decoder._expected is not None else 0
    ) == len(data)
