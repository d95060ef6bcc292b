"""The history checker every fault test relies on catches what it must."""

from __future__ import annotations

import pytest

from tests.harness.history import History, value


def good() -> History:
    history = History()
    for offset, seq in enumerate(range(5)):
        data = value("p1", seq)
        history.ack("t", 0, offset, data)
        history.saw("t", 0, offset, data)
    return history


def test_a_clean_history_passes():
    assert "5 acked, 5 read" in good().check()


def test_a_lost_acked_record_fails():
    history = good()
    history.ack("t", 1, 0, value("p1", 99))
    with pytest.raises(AssertionError, match="lost"):
        history.check()


def test_a_duplicate_fails():
    history = good()
    history.saw("t", 0, 5, value("p1", 4))
    with pytest.raises(AssertionError, match="duplicates"):
        history.check()


def test_two_values_at_one_offset_fail():
    history = good()
    history.saw("t", 0, 2, value("p2", 0))
    with pytest.raises(AssertionError, match="two values"):
        history.check()


def test_a_producer_out_of_order_fails():
    history = History()
    history.saw("t", 0, 0, value("p1", 1))
    history.saw("t", 0, 1, value("p1", 0))
    with pytest.raises(AssertionError, match="out of order"):
        history.check()
