"""The overview's chart: the history as SVG polylines, computed here, drawn by the template.

Only numbers leave this module (coordinates, tick labels); the queue names
in the legend go through the template's autoescape like every other value.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from hermes.dashboard._state import HISTORY_S, Minute, Sample, per_minute

WIDTH = 640
HEIGHT = 160
#: Space for the y-axis labels on the left and the time labels below.
LEFT = 48
BOTTOM = 20
#: Line colours, one per priority, in the order of the legend (CSS classes).
SERIES = 6
#: The shortest span the chart shows: a fresh dashboard's first minutes fill it.
MIN_SPAN_S = 300.0


@dataclass(frozen=True, slots=True)
class Line:
    priority: int
    points: str
    latest: int | None
    css: str


@dataclass(frozen=True, slots=True)
class Chart:
    lines: list[Line]
    top: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: int = BOTTOM
    samples: int = 0
    #: How far back the left edge is, in minutes.
    span_min: int = int(HISTORY_S // 60)


def chart(history: Sequence[Sample], now: float | None = None) -> Chart:
    """Waiting messages per priority since the first sample, over the last hour at most
    (5 minutes at least): a fresh dashboard's samples span the chart, not its right edge.
    Unknown counts leave gaps out."""
    now = time.time() if now is None else now
    sampled = now - history[0].at if history else 0.0
    span = min(HISTORY_S, max(MIN_SPAN_S, sampled))
    priorities = sorted({p for s in history for p in s.waiting}, reverse=True)
    known = [v for s in history for v in s.waiting.values() if v is not None]
    top: int = max([*known, 1])
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM

    def x(at: float) -> float:
        return float(LEFT + plot_w * max(0.0, 1 - (now - at) / span))

    def y(value: int) -> float:
        return float(plot_h - plot_h * value / top)

    lines = []
    for n, priority in enumerate(priorities):
        values = [(s.at, s.waiting.get(priority)) for s in history]
        points = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in values if v is not None)
        latest = next((v for _, v in reversed(values) if v is not None), None)
        lines.append(Line(priority, points, latest, f"series-{n % SERIES}"))
    return Chart(lines, top, samples=len(history), span_min=round(span / 60))


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: str
    #: The last whole minute's count (the minute under way's while it is the only one).
    latest: int
    css: str


@dataclass(frozen=True, slots=True)
class ActivityChart:
    """Handled, failed and retried per minute: one polyline each, over the same span."""

    series: list[Series]
    top: int
    minutes: int
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: int = BOTTOM
    span_min: int = int(HISTORY_S // 60)


#: The activity chart's series: the Minute field, its label, its colour (CSS class).
ACTIVITY = (
    ("handled", "handled", "series-2"),
    ("failed", "failed", "series-3"),
    ("retried", "retried", "series-1"),
)


def activity_chart(history: Sequence[Sample], now: float | None = None) -> ActivityChart:
    """Jobs handled, failed and retried per minute by the live workers, over the same span
    as :func:`chart`; each minute's point at its middle."""
    now = time.time() if now is None else now
    minutes: list[Minute] = per_minute(history)
    sampled = now - history[0].at if history else 0.0
    span = min(HISTORY_S, max(MIN_SPAN_S, sampled))
    top = max([1, *(getattr(m, field) for m in minutes for field, _, _ in ACTIVITY)])
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM

    def x(at: float) -> float:
        return float(LEFT + plot_w * min(1.0, max(0.0, 1 - (now - at) / span)))

    def y(value: int) -> float:
        return float(plot_h - plot_h * value / top)

    whole = [m for m in minutes if m.at + 60 <= now] or minutes[-1:]
    series = []
    for field, label, css in ACTIVITY:
        values = [(m.at + 30, getattr(m, field)) for m in minutes]
        points = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in values)
        latest = getattr(whole[-1], field) if whole else 0
        series.append(Series(label, points, latest, css))
    return ActivityChart(series, top, len(minutes), span_min=round(span / 60))
