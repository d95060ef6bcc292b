"""Line charts drawn on the server as inline SVG (no JavaScript, nothing fetched), and the
number formats the console's templates use.

`line_chart` returns a standalone ``<svg>`` element as `markupsafe.Markup`, ready to put in a
template as is. Every text in it (title, unit, series names: group names are chosen by users)
is escaped here, so the markup is safe whatever the names hold. The chart is an image to
assistive technology (``role="img"``, an ``aria-label`` with each series' latest value); each
line and its last point carry a ``<title>`` shown on hover. Times are UTC (HH:MM:SS); values
are scaled to human units (B/s, KB/s, MB/s, ... for ``unit="B/s"``; k, M, G otherwise). Sizes
are decimal (1 KB = 1000 B), as S3 bills them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

# Okabe-Ito: told apart by colour-blind readers too.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#000000")
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 24, 22  # plot margins (axis labels, title)
_LEGEND_ROW = 16  # px a legend row adds below the chart
_CHAR_PX = 6.5  # estimated width of a character at font-size 11, to wrap the legend
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
_FONT = 'font-family="sans-serif" font-size="11"'
_ARIA_SERIES = 8  # series named in the aria-label; more would be noise


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    unit: str,
    width: int = 560,
    height: int = 180,
) -> Markup:
    """A chart of `series` (name -> (unix seconds, value) points), one colour each, with a
    legend below: the SVG is `height` px plus a row per legend line. Non-finite points are
    left out; without any point the chart says "no samples yet"."""
    lines = {
        name: [(t, v) for t, v in points if math.isfinite(t) and math.isfinite(v)]
        for name, points in series.items()
    }
    lines = {name: points for name, points in lines.items() if points}
    if not lines:
        return _empty(title, width, height)
    times = [t for points in lines.values() for t, _ in points]
    values = [v for points in lines.values() for _, v in points]
    t0, t1 = min(times), max(times)
    y_ticks = value_ticks(min(0.0, min(values)), max(values))
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + (plot_w / 2 if t1 == t0 else (t - t0) / (t1 - t0) * plot_w)

    def y(v: float) -> float:
        return _TOP + plot_h - (v - y0) / (y1 - y0) * plot_h

    legend, rows = _legend(list(lines), width, height)
    latest = {name: points[-1][1] for name, points in lines.items()}
    parts = [_open(title, width, height + rows * _LEGEND_ROW, _aria(title, latest, unit))]
    for tick in y_ticks:
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            f'stroke="#e3e3e3"/>'
            f'<text x="{_LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" {_FONT} '
            f'fill="#555">{escape(format_rate(tick, unit))}</text>'
        )
    for tick in time_ticks(t0, t1):
        parts.append(
            f'<text x="{x(tick):.1f}" y="{height - 6}" text-anchor="middle" {_FONT} '
            f'fill="#555">{_clock(tick)}</text>'
        )
    parts.append(f'<text x="4" y="{height - 6}" {_FONT} fill="#555">UTC</text>')
    for i, (name, points) in enumerate(lines.items()):
        colour = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        last_t, last_v = points[-1]
        hover = f"{name}: {format_rate(last_v, unit)} at {_clock(last_t)} UTC"
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5">'
            f"<title>{escape(hover)}</title></polyline>"
            f'<circle cx="{x(last_t):.1f}" cy="{y(last_v):.1f}" r="2.5" fill="{colour}">'
            f"<title>{escape(hover)}</title></circle>"
        )
    parts.extend(legend)
    parts.append("</svg>")
    return Markup("".join(parts))


def _open(title: str, width: int, height: int, aria: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="{escape(aria)}"><title>{escape(aria)}</title>'
        f'<text x="{_LEFT}" y="15" {_FONT} font-weight="bold" fill="#222">{escape(title)}</text>'
    )


def _empty(title: str, width: int, height: int) -> Markup:
    return Markup(
        _open(title, width, height, f"{title}: no samples yet")
        + f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" {_FONT} '
        f'fill="#777">no samples yet</text></svg>'
    )


def _aria(title: str, latest: Mapping[str, float], unit: str) -> str:
    named = [f"{name} {format_rate(value, unit)}" for name, value in latest.items()]
    more = len(named) - _ARIA_SERIES
    text = ", ".join(named[:_ARIA_SERIES]) + (f" and {more} more" if more > 0 else "")
    return f"{title}, latest: {text}"


def _legend(names: list[str], width: int, top: int) -> tuple[list[str], int]:
    """Legend entries laid out left to right under the chart, wrapped at its width."""
    parts: list[str] = []
    row, left = 1, float(_LEFT)
    for i, name in enumerate(names):
        size = 16 + _CHAR_PX * len(name) + 12
        if left + size > width and left > _LEFT:
            row, left = row + 1, float(_LEFT)
        y = top + (row - 1) * _LEGEND_ROW
        parts.append(
            f'<rect x="{left:.1f}" y="{y + 3}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{left + 14:.1f}" y="{y + 12}" {_FONT} fill="#222">{escape(name)}</text>'
        )
        left += size
    return parts, row


def value_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """Round tick values from at most `low` to at least `high`, about `count` steps apart."""
    if high <= low:
        high = low + 1
    step = _nice((high - low) / count)
    start = math.floor(low / step) * step
    steps = math.ceil(round((high - start) / step, 9))
    return [round(start + i * step, 12) for i in range(steps + 1)]


def _nice(x: float) -> float:
    magnitude = 10.0 ** math.floor(math.log10(x))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if x <= m * magnitude * (1 + 1e-9))


def time_ticks(t0: float, t1: float, most: int = 6) -> list[float]:
    """At most `most` ticks on round times (every 1 s, 5 s, 1 min, ...) within [t0, t1]."""
    span = t1 - t0
    step = next((s for s in _TIME_STEPS if span / s <= most - 1), None)
    if step is None:
        step = 86400 * math.ceil(span / 86400 / (most - 1))
    ticks = [float(s * step) for s in range(math.ceil(t0 / step), math.floor(t1 / step) + 1)]
    return ticks or [t0]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _number(value: float) -> str:
    """About three significant digits, no exponent, no trailing zeros."""
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(value: float, units: Sequence[str]) -> tuple[str, str]:
    for unit in units[:-1]:
        if abs(value) < 999.5:
            return _number(value), unit
        value /= 1000
    return _number(value), units[-1]


def format_bytes(n: float) -> str:
    """Bytes in decimal units: ``0 B``, ``1.5 KB``, ``12.3 MB``, ``2 GB``."""
    number, unit = _scaled(n, ("B", "KB", "MB", "GB", "TB", "PB"))
    return f"{number} {unit}"


def format_rate(x: float, unit: str) -> str:
    """A value of `unit`: ``B/s`` and ``B`` scaled as bytes (``1.2 MB/s``); anything else
    with k, M, G (``1.5k req/s``)."""
    if unit in ("B/s", "B"):
        return format_bytes(x) + unit[1:]
    number, prefix = _scaled(x, ("", "k", "M", "G", "T"))
    return f"{number}{prefix} {unit}".rstrip()


def format_age(ms: int | None, now_ms: int) -> str:
    """How long ago a Kafka timestamp (ms) was: ``12 s ago``, ``5 min ago``, ``3 h ago``,
    ``2 d ago``; ``-`` for none (None or negative, Kafka's -1)."""
    if ms is None or ms < 0:
        return "-"
    age = (now_ms - ms) / 1000
    if age < -1:
        return "in the future"  # a producer's clock ahead of ours (CreateTime)
    for limit, seconds, unit in ((60, 1, "s"), (3600, 60, "min"), (86400, 3600, "h")):
        if age < limit:
            return f"{max(0, int(age // seconds))} {unit} ago"
    return f"{int(age // 86400)} d ago"
