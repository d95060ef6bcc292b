"""Leader epoch history: what claims append, what retention forgets, what OffsetForLeaderEpoch
answers (Kafka's LeaderEpochFileCache.endOffsetFor)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.metadata.epochs import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    end_offset_for,
    epoch_for_offset,
    history,
    started,
    truncated,
)

HISTORY = [(0, 0), (2, 100), (5, 250)]


def test_an_older_record_reads_as_one_epoch_from_the_log_start():
    assert history([], 0, 40) == [(0, 40)]
    assert history([[3, 7], [4, 9]], 4, 0) == [(3, 7), (4, 9)]


def test_a_claim_appends_its_epoch_at_the_high_watermark():
    assert started(HISTORY, 6, 300) == [*HISTORY, (6, 300)]


def test_an_epoch_that_wrote_nothing_is_dropped():
    assert started(HISTORY, 6, 250) == [(0, 0), (2, 100), (6, 250)]
    assert started(started(HISTORY, 6, 250), 7, 250) == [(0, 0), (2, 100), (7, 250)]


def test_epochs_only_grow_and_never_start_before_the_last():
    with pytest.raises(ValueError):
        started(HISTORY, 5, 400)
    with pytest.raises(ValueError):
        started(HISTORY, 6, 200)


def test_retention_forgets_epochs_that_ended_before_the_log_start():
    assert truncated(HISTORY, 0) == HISTORY
    assert truncated(HISTORY, 99) == HISTORY
    assert truncated(HISTORY, 100) == [(2, 100), (5, 250)]
    assert truncated(HISTORY, 249) == [(2, 100), (5, 250)]
    assert truncated(HISTORY, 10_000) == [(5, 250)]


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (5, (5, 400)),  # the current epoch ends at the log end
        (4, (2, 250)),  # unknown epoch between known ones: the one below, ending where 5 starts
        (2, (2, 250)),
        (1, (0, 100)),
        (0, (0, 100)),
        (6, (UNDEFINED_EPOCH, UNDEFINED_OFFSET)),  # newer than this leader knows
        (UNDEFINED_EPOCH, (UNDEFINED_EPOCH, UNDEFINED_OFFSET)),
    ],
)
def test_end_offset_for_an_epoch(requested, expected):
    assert end_offset_for(HISTORY, requested, 400) == expected


def test_an_epoch_older_than_every_known_one_ends_where_the_first_starts():
    assert end_offset_for([(3, 50), (4, 90)], 1, 100) == (1, 50)


@pytest.mark.parametrize(
    ("offset", "epoch"),
    [(0, 0), (99, 0), (100, 2), (249, 2), (250, 5), (10_000, 5)],
)
def test_the_epoch_that_wrote_an_offset(offset, epoch):
    # What ListOffsets names with the offset it finds (Kafka's epochForOffset).
    assert epoch_for_offset(HISTORY, offset) == epoch


def test_an_offset_before_the_history_has_no_epoch():
    assert epoch_for_offset([(3, 50), (4, 90)], 49) == UNDEFINED_EPOCH
    assert epoch_for_offset([], 0) == UNDEFINED_EPOCH


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=20), st.integers(0, 30))
def test_a_consumer_position_is_never_beyond_its_epoch_end(offsets, requested):
    # Whatever the claims, an offset written at epoch E is below E's end offset: no consumer
    # that read committed data ever sees truncation.
    entries: list[tuple[int, int]] = []
    written: list[tuple[int, int]] = []  # (epoch, offset of a record written then)
    position = 0
    for epoch, extra in enumerate(sorted(offsets)):
        entries = started(entries, epoch, position)
        position = max(position, extra)
        written += [(epoch, o) for o in range(entries[-1][1], position)]
    for epoch, offset in written:
        answered_epoch, end = end_offset_for(entries, epoch, position)
        assert answered_epoch <= epoch and end > offset
    assert end_offset_for(entries, requested + len(offsets), position)[1] in (
        position,
        UNDEFINED_OFFSET,
    )
