"""kafscale.console.charts (SVG line charts, number formats) and kafscale.console.cost."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from markupsafe import Markup

from kafscale.console import cost
from kafscale.console.charts import (
    PALETTE,
    format_age,
    format_bytes,
    format_rate,
    line_chart,
    time_ticks,
    value_ticks,
)

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000.0  # 22:13:20 UTC
NAN = float("nan")


def parsed(chart: Markup) -> ET.Element:
    root = ET.fromstring(str(chart))
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_a_chart_is_valid_svg_with_axes_legend_and_hover() -> None:
    series = {
        "produce": [(T0 + i * 5, 1_000_000.0 * i) for i in range(13)],
        "fetch": [(T0 + i * 5, 500_000.0) for i in range(13)],
    }
    chart = line_chart(series, title="Produce and fetch", unit="B/s")
    assert isinstance(chart, Markup)
    root = parsed(chart)
    assert root.get("role") == "img"
    aria = "Produce and fetch, latest: produce 12 MB/s, fetch 500 KB/s"
    assert root.get("aria-label") == aria
    labels = texts(root)
    assert labels[0] == "Produce and fetch"
    # y: from 0 past 12 MB/s in round steps; x: every 15 s on the clock, in UTC
    assert labels[1:5] == ["0 B/s", "5 MB/s", "10 MB/s", "15 MB/s"]
    assert labels[5:10] == ["22:13:30", "22:13:45", "22:14:00", "22:14:15", "UTC"]
    assert labels[-2:] == ["produce", "fetch"]  # the legend
    lines = list(root.iter(f"{SVG}polyline"))
    assert [line.get("stroke") for line in lines] == list(PALETTE[:2])
    assert len(lines[0].get("points", "").split()) == 13
    hovers = [t.text for t in root.iter(f"{SVG}title")]
    assert "produce: 12 MB/s at 22:14:20 UTC" in hovers


def test_every_name_is_escaped() -> None:
    hostile = '<script>alert("x")</script>&'
    chart = line_chart({hostile: [(T0, 1.0), (T0 + 5, 2.0)]}, title=hostile, unit="<b>")
    assert "<script>" not in chart
    root = parsed(chart)  # still well-formed
    assert hostile in texts(root)  # shown as text, not run
    assert hostile in (root.get("aria-label") or "")


def test_no_samples_yet() -> None:
    empty: list[dict[str, list[tuple[float, float]]]] = [{}, {"lag": []}, {"lag": [(T0, NAN)]}]
    for series in empty:
        root = parsed(line_chart(series, title="Lag of g", unit="records"))
        assert "no samples yet" in texts(root)
        assert root.get("aria-label") == "Lag of g: no samples yet"
        assert list(root.iter(f"{SVG}polyline")) == []


def test_one_point_is_drawn_in_the_middle() -> None:
    root = parsed(line_chart({"lag": [(T0, 7.0)]}, title="Lag", unit="records", width=400))
    (circle,) = root.iter(f"{SVG}circle")
    assert float(circle.get("cx", "")) == 64 + (400 - 64 - 12) / 2


def test_the_legend_wraps_and_the_chart_grows() -> None:
    series = {f"consumer-group-{i}": [(T0, float(i))] for i in range(12)}
    root = parsed(line_chart(series, title="Lag", unit="records", width=400, height=180))
    assert int(root.get("height", "")) > 180
    assert len(list(root.iter(f"{SVG}rect"))) == 12


def test_value_ticks() -> None:
    assert value_ticks(0, 12e6) == [0, 5e6, 10e6, 15e6]
    assert value_ticks(0, 7) == [0, 2, 4, 6, 8]
    assert value_ticks(0, 0) == [0, 0.25, 0.5, 0.75, 1]
    assert value_ticks(-3, 5) == [-4, -2, 0, 2, 4, 6]
    assert value_ticks(0, 0.03) == [0, 0.01, 0.02, 0.03]


def test_time_ticks() -> None:
    assert time_ticks(T0, T0 + 1800) == [T0 - 200 + 600 * i for i in range(1, 4)]
    assert time_ticks(T0 + 0.5, T0 + 0.5) == [T0 + 0.5]
    assert len(time_ticks(T0, T0 + 7 * 86400)) <= 6


def test_formats() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(999) == "999 B"
    assert format_bytes(1500) == "1.5 KB"
    assert format_bytes(12_345_678) == "12.3 MB"
    assert format_bytes(999_700) == "1 MB"
    assert format_bytes(2e9) == "2 GB"
    assert format_rate(2_500_000, "B/s") == "2.5 MB/s"
    assert format_rate(1500, "req/s") == "1.5k req/s"
    assert format_rate(0.05, "req/s") == "0.05 req/s"
    assert format_rate(0.00012, "req/s") == "0.00012 req/s"
    assert format_rate(42, "records") == "42 records"
    assert format_rate(-3, "records") == "-3 records"


def test_format_age() -> None:
    now = 1_700_000_000_000
    assert format_age(now - 12_400, now) == "12 s ago"
    assert format_age(now - 5 * 60_000, now) == "5 min ago"
    assert format_age(now - 3 * 3_600_000 - 1, now) == "3 h ago"
    assert format_age(now - 2 * 86_400_000, now) == "2 d ago"
    assert format_age(now + 500, now) == "0 s ago"  # clocks a little apart
    assert format_age(now + 60_000, now) == "in the future"
    assert format_age(-1, now) == "-" and format_age(None, now) == "-"


# -- cost ----------------------------------------------------------------------------------------


def test_cost_at_the_spec_prices() -> None:
    # 4 PUT/s: 4 * 2,592,000 s = 10,368,000 PUTs at $0.005/1000 = $51.84
    # 10 GET/s: 25,920,000 GETs at $0.0004/1000 = $10.368; 1 DELETE/s free
    # 700 GB (the appendix's 7 days of 100 GB) at $0.023 = $16.10
    estimate = cost.estimate({"put": 4.0, "get": 10.0, "delete": 1.0}, 700 * 10**9)
    assert estimate.requests == pytest.approx({"put": 51.84, "get": 10.368, "delete": 0.0})
    assert estimate.storage == pytest.approx(16.10)
    assert estimate.requests_total == pytest.approx(62.208)
    assert estimate.total == pytest.approx(78.308)
    assert [(r.name, r.rate) for r in estimate.rows] == [
        ("PUT requests", "4 req/s"),
        ("GET requests", "10 req/s"),
        ("DELETE requests", "1 req/s"),
        ("Storage", "700 GB"),
    ]
    assert "$0.005" in estimate.basis and "$0.023 per GB-month" in estimate.basis


def test_cost_prices_can_be_overridden_and_unknown_operations_cost_as_gets() -> None:
    prices = cost.Prices(
        per_1000_requests={"put": 0.01}, other_per_1000_requests=0.001, storage_per_gb_month=0.1
    )
    estimate = cost.estimate({"put": 1.0, "copy": 1.0}, 10**9, prices)
    assert estimate.requests == pytest.approx({"put": 25.92, "copy": 2.592})
    assert estimate.storage == pytest.approx(0.1)


def test_cost_refuses_negative_inputs() -> None:
    with pytest.raises(ValueError):
        cost.estimate({"put": -1.0}, 0)
    with pytest.raises(ValueError):
        cost.estimate({}, -1)
