"""The console's pure page logic: which offsets the message browser reads, how records are
shown and matched, and the offsets a group reset commits."""

from __future__ import annotations

import pytest
from aiohttp import web

from kafscale.console.groups import reset_targets
from kafscale.console.messages import matcher, plan_ranges, show
from kafscale.console.model import GroupOffset, Message
from kafscale.console.topics import _parse_configs
from kafscale.console.web import _retention, parse_moment

MARKS = {0: (10, 100), 1: (0, 5), 2: (7, 7)}


def test_ranges_from_the_end_hold_the_last_records() -> None:
    assert plan_ranges("end", MARKS, 20) == {0: (80, 100), 1: (0, 5), 2: (7, 7)}


def test_ranges_from_the_beginning_start_at_the_log_start() -> None:
    assert plan_ranges("beginning", MARKS, 20) == {0: (10, 30), 1: (0, 5), 2: (7, 7)}


def test_ranges_from_an_offset_are_clamped_into_the_log() -> None:
    assert plan_ranges("offset", MARKS, 20, offset=3) == {0: (10, 30), 1: (3, 5), 2: (7, 7)}
    assert plan_ranges("offset", MARKS, 20, offset=500) == {0: (100, 100), 1: (5, 5), 2: (7, 7)}


def test_ranges_from_a_time_start_where_list_offsets_said_or_at_the_end() -> None:
    found = plan_ranges("timestamp", MARKS, 20, by_time={0: 50, 1: -1})
    assert found == {0: (50, 70), 1: (5, 5), 2: (7, 7)}


def test_filtered_ranges_run_to_the_high_watermark() -> None:
    assert plan_ranges("beginning", MARKS, 20, filtered=True)[0] == (10, 100)


def test_partitions_without_offsets_are_left_out() -> None:
    assert plan_ranges("end", {0: (-1, -1), 1: (0, 3)}, 10) == {1: (0, 3)}


def message(key: bytes | None, value: bytes | None, headers=()) -> Message:  # type: ignore[no-untyped-def]
    return Message(0, 1, 1_700_000_000_000, "CreateTime", key, value, tuple(headers))


def test_show_as_text_json_and_hex() -> None:
    m = message(b"k", b'{"a": [1, 2]}', [("h", b"v")])
    assert show(m, "text").value == '{"a": [1, 2]}'
    pretty = show(m, "json")
    assert pretty.value_format == "json" and pretty.value.startswith("{\n  ")
    assert show(message(None, b"not json"), "json").value_format == "text"
    hexed = show(m, "hex")
    assert hexed.key == "6b" and hexed.headers == (("h", "76"),)
    assert show(message(None, None), "text").value == "null"
    assert show(message(b"\xff", b"x"), "text").key == "\ufffd"


def test_matcher_by_key_and_anywhere() -> None:
    assert matcher("", "") is None
    by_key = matcher("ord", "")
    assert by_key is not None
    assert by_key(message(b"order-1", b"x")) and not by_key(message(None, b"order"))
    anywhere = matcher("", "needle")
    assert anywhere is not None
    assert anywhere(message(None, b"a needle here"))
    assert anywhere(message(b"needle", None))
    assert anywhere(message(None, None, [("trace", b"needle")]))
    assert not anywhere(message(b"k", b"v", [("h", b"v")]))


OFFSETS = (
    GroupOffset("a", 0, committed=50, end=100, start=10),
    GroupOffset("a", 1, committed=-1, end=30, start=0),
    GroupOffset("b", 0, committed=5, end=5, start=5),
    GroupOffset("c", 0, committed=5, end=-1, start=-1),
)


def test_lag() -> None:
    assert [o.lag for o in OFFSETS] == [50, None, 0, None]


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("earliest", {("a", 0): 10, ("a", 1): 0, ("b", 0): 5}),
        ("latest", {("a", 0): 100, ("a", 1): 30, ("b", 0): 5}),
    ],
)
def test_reset_to_earliest_or_latest(how: str, expected: dict[tuple[str, int], int]) -> None:
    assert reset_targets(OFFSETS, how) == expected


def test_reset_of_one_topic_to_an_offset_is_clamped() -> None:
    assert reset_targets(OFFSETS, "offset", topic="a", offset=20) == {("a", 0): 20, ("a", 1): 20}
    assert reset_targets(OFFSETS, "offset", topic="a", offset=0) == {("a", 0): 10, ("a", 1): 0}


def test_reset_to_a_time_uses_the_found_offsets_or_the_end() -> None:
    found = reset_targets(OFFSETS, "timestamp", by_time={("a", 0): 42, ("a", 1): -1})
    assert found == {("a", 0): 42, ("a", 1): 30, ("b", 0): 5}


def test_config_lines() -> None:
    assert _parse_configs("retention.ms = 1000\n\ncleanup.policy=compact\n") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
    }
    with pytest.raises(web.HTTPBadRequest) as refused:
        _parse_configs("retention.ms")
    assert "line 1" in refused.value.text


def test_retention_and_moments() -> None:
    assert _retention("604800000") == "7 d"
    assert _retention("-1") == "forever"
    assert _retention("1500") == "1500 ms"
    assert parse_moment("1700000000000") == 1_700_000_000_000
    assert parse_moment("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_moment("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(web.HTTPBadRequest) as refused:
        parse_moment("yesterday")
    assert "timestamp: 'yesterday'" in refused.value.text


def test_filtered_ranges_from_the_end_reach_back_a_share_of_the_scan() -> None:
    marks = {0: (0, 50_000), 1: (40_000, 50_000)}
    found = plan_ranges("end", marks, 20, filtered=True, scan=10_000)
    assert found == {0: (45_000, 50_000), 1: (45_000, 50_000)}
