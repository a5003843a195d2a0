"""The console's charts of a group's history: inline SVG rendered by the server, no script.

Every chart is a ``<svg>`` with a ``viewBox`` and ``width: 100%`` (it scales to a narrow
screen; text scales with it), coloured by CSS variables only (``--sq-handled`` and the
like in ``style.css``, which follow the admin's light and dark themes). Each bucket carries
a ``<title>`` with its numbers (the browser's hover text), a bucket without a lag sample is
drawn as a gap (no line, a shaded band), and operator actions as vertical markers with a
``<title>`` of their own. :func:`numbers_table` gives the same numbers as a table, for
screen readers and for copying. Every text that comes from outside (a group, a topic, a
marker's label) is escaped.

The markup is built as strings (``format_html`` for anything interpolated): a 7-day chart
has 168 buckets, and the overview up to ``ops.history.MAX_PAIRS`` sparklines, which a
template loop would render several times slower.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..ops.history import Point, Series

#: An operator action to mark on a chart: its time and the text of its hover title.
Marker = tuple[dt.datetime, str]

#: The large charts' coordinate system (the viewBox): the plot sits inside the margins.
WIDTH = 720
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 20, 24
THROUGHPUT_HEIGHT, LAG_HEIGHT = 200, 130
#: The sparkline's viewBox (stretched to its cell: strokes keep their width).
SPARK_WIDTH, SPARK_HEIGHT = 120, 28
#: Time labels under a large chart.
TICKS = 5


def _when(at: dt.datetime) -> str:
    return f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def _lag_text(p: Point) -> str:
    return "no sample" if p.lag is None else str(p.lag)


def point_title(p: Point, step: int) -> str:
    """The hover text of one bucket: its start (UTC), length and every figure."""
    length = f"{step} min from " if step > 1 else ""
    return (
        f"{length}{_when(p.at)}: published {p.published}, handled {p.handled}, failed {p.failed}, "
        f"retried {p.retried}, dead-lettered {p.dead_lettered}, lag {_lag_text(p)}"
    )


def _n(value: float) -> str:
    """A coordinate, short: one decimal at most."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _segments(points: Sequence[Point]) -> list[list[tuple[int, int]]]:
    """Runs of consecutive buckets with a lag sample: ``(index, lag)``; a None breaks the line."""
    runs: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    for i, p in enumerate(points):
        if p.lag is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, p.lag))
    if current:
        runs.append(current)
    return runs


def _polyline(cls: str, coords: Iterable[tuple[float, float]]) -> str:
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in coords)
    return f'<polyline class="{cls}" points="{points}" vector-effect="non-scaling-stroke"/>'


def sparkline(series: Series) -> SafeString:
    """A small chart of the window: handled (solid) against published (dashed), and the lag on
    its own scale (gaps where no sample was taken). Its ``<title>`` says the totals."""
    points = series.points
    n = max(len(points), 1)
    t = series.totals()
    peak = max([max(p.handled, p.published) for p in points] + [1])
    lag_peak = max([p.lag or 0 for p in points] + [1])
    dx = SPARK_WIDTH / max(n - 1, 1)
    h = SPARK_HEIGHT - 2

    def y(value: int, top: int) -> float:
        return 1 + h - h * value / top

    parts = [
        _polyline("sq-published", ((i * dx, y(p.published, peak)) for i, p in enumerate(points))),
        _polyline("sq-handled", ((i * dx, y(p.handled, peak)) for i, p in enumerate(points))),
    ]
    for run in _segments(points):
        if len(run) == 1:
            run = [run[0], run[0]]  # one sample: a dot-like stub, still visible
        parts.append(_polyline("sq-lag", ((i * dx, y(lag, lag_peak)) for i, lag in run)))
    title = (
        f"{series.group} on {series.topic}, last {series.window}: published {t.published}, handled {t.handled}, "
        f"failed {t.failed}, dead-lettered {t.dead_lettered}; lag {'no sample' if t.lag is None else t.lag} "
        f"(highest {max(p.lag or 0 for p in points) if points else 0})"
    )
    return mark_safe(  # every interpolated text is escaped or a number
        f'<svg class="sq-chart sq-spark" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}" preserveAspectRatio="none" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>{"".join(parts)}</svg>'
    )


class _Frame:
    """A large chart's plot area: bucket ``i`` -> x, value -> y."""

    def __init__(self, series: Series, height: int, top_value: int) -> None:
        self.series, self.height, self.top_value = series, height, max(top_value, 1)
        self.n = max(len(series.points), 1)
        self.plot_w = WIDTH - LEFT - RIGHT
        self.plot_h = height - TOP - BOTTOM
        self.bw = self.plot_w / self.n

    def x(self, i: float) -> float:
        return LEFT + i * self.bw

    def y(self, value: float) -> float:
        return TOP + self.plot_h - self.plot_h * value / self.top_value

    def at_x(self, at: dt.datetime) -> float | None:
        """The x of a time inside the window (None: outside it)."""
        points = self.series.points
        if not points:
            return None
        start = points[0].at
        end = points[-1].at + dt.timedelta(minutes=self.series.step)
        if not start <= at <= end:
            return None
        return LEFT + self.plot_w * (at - start).total_seconds() / (end - start).total_seconds()

    def axes(self, unit: str) -> str:
        """The baseline, the top line with the largest value, and the time labels (UTC)."""
        bottom = TOP + self.plot_h
        out = [
            f'<line class="sq-axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}"/>',
            f'<line class="sq-grid" x1="{LEFT}" y1="{TOP}" x2="{WIDTH - RIGHT}" y2="{TOP}"/>',
            f'<text class="sq-label" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{self.top_value}</text>',
            f'<text class="sq-label" x="{LEFT - 4}" y="{bottom}" text-anchor="end">0</text>',
            f'<text class="sq-label sq-unit" x="{LEFT}" y="{TOP - 5}">{escape(unit)}</text>',
        ]
        points = self.series.points
        if points:
            day = self.series.step >= 15
            for k in range(TICKS):
                i = round(k * (len(points) - 1) / (TICKS - 1))
                at = points[i].at.astimezone(dt.UTC)
                label = f"{at:%m-%d %H:%M}" if day else f"{at:%H:%M}"
                anchor = "start" if k == 0 else "end" if k == TICKS - 1 else "middle"
                x = self.x(i) if k < TICKS - 1 else self.x(i + 1)
                out.append(
                    f'<text class="sq-label" x="{_n(x)}" y="{bottom + 16}" text-anchor="{anchor}">{label}</text>'
                )
            out.append(
                f'<text class="sq-label sq-unit" x="{WIDTH - RIGHT}" y="{TOP - 5}" text-anchor="end">time (UTC)</text>'
            )
        return "".join(out)

    def hover(self) -> str:
        """One transparent band per bucket, the height of the plot, titled with its numbers."""
        step = self.series.step
        return "".join(
            f'<rect class="sq-hit" x="{_n(self.x(i))}" y="{TOP}" width="{_n(self.bw)}" height="{self.plot_h}">'
            f"<title>{escape(point_title(p, step))}</title></rect>"
            for i, p in enumerate(self.series.points)
        )

    def markers(self, markers: Sequence[Marker]) -> str:
        out = []
        for at, label in markers:
            x = self.at_x(at)
            if x is None:
                continue
            title = escape(f"{_when(at)}: {label}")
            line = f'x1="{_n(x)}" y1="{TOP}" x2="{_n(x)}" y2="{TOP + self.plot_h}"'
            out.append(
                f'<g class="sq-marker"><title>{title}</title><line class="sq-marker-line" {line}/>'
                f'<line class="sq-marker-hit" {line}/></g>'
            )
        return "".join(out)

    def svg(self, cls: str, label: str, body: str) -> SafeString:
        return mark_safe(  # every interpolated text is escaped or a number
            f'<svg class="sq-chart {cls}" viewBox="0 0 {WIDTH} {self.height}" role="img" '
            f'aria-label="{escape(label)}"><title>{escape(label)}</title>{body}</svg>'
        )


def _per(series: Series) -> str:
    return "per minute" if series.step == 1 else f"per {series.step} min"


def throughput_chart(series: Series, markers: Sequence[Marker] = ()) -> SafeString:
    """Stacked bars of handled, failed and dead-lettered per bucket, published as a dashed line."""
    points = series.points
    top = max([max(p.handled + p.failed + p.dead_lettered, p.published) for p in points] + [1])
    f = _Frame(series, THROUGHPUT_HEIGHT, top)
    bars = []
    gap = f.bw * 0.15
    for i, p in enumerate(points):
        if p.lag is None:
            bars.append(_nodata(f, i))
        base = 0
        for cls, value in (("sq-handled", p.handled), ("sq-failed", p.failed), ("sq-dead", p.dead_lettered)):
            if value:
                y0, y1 = f.y(base + value), f.y(base)
                bars.append(
                    f'<rect class="{cls}" x="{_n(f.x(i) + gap / 2)}" y="{_n(y0)}" '
                    f'width="{_n(f.bw - gap)}" height="{_n(y1 - y0)}"/>'
                )
                base += value
    published = _polyline("sq-published", ((f.x(i + 0.5), f.y(p.published)) for i, p in enumerate(points)))
    label = (
        f"{series.group} on {series.topic}: handled, failed and dead-lettered {_per(series)} "
        f"(published dashed), last {series.window}"
    )
    body = f.axes(f"messages {_per(series)}") + "".join(bars) + published + f.markers(markers) + f.hover()
    return f.svg("sq-throughput", label, body)


def _nodata(f: _Frame, i: int) -> str:
    return f'<rect class="sq-nodata" x="{_n(f.x(i))}" y="{TOP}" width="{_n(f.bw)}" height="{f.plot_h}"/>'


def lag_chart(series: Series, markers: Sequence[Marker] = ()) -> SafeString:
    """The lag at each bucket's last sample, on its own scale; no line across buckets without one."""
    points = series.points
    f = _Frame(series, LAG_HEIGHT, max([p.lag or 0 for p in points] + [1]))
    parts = [_nodata(f, i) for i, p in enumerate(points) if p.lag is None]
    for run in _segments(points):
        if len(run) == 1:
            i, lag = run[0]
            parts.append(f'<circle class="sq-lag-dot" cx="{_n(f.x(i + 0.5))}" cy="{_n(f.y(lag))}" r="2.5"/>')
        else:
            parts.append(_polyline("sq-lag", ((f.x(i + 0.5), f.y(lag)) for i, lag in run)))
    label = f"{series.group} on {series.topic}: lag (messages behind), last {series.window}"
    return f.svg("sq-lagchart", label, f.axes("lag") + "".join(parts) + f.markers(markers) + f.hover())


def numbers_table(series: Series) -> SafeString:
    """The chart's numbers, one row per bucket (newest first), as the hover titles say them."""
    rows = "".join(
        f'<tr><td class="sq-time">{_when(p.at)}</td><td class="num">{p.published}</td><td class="num">{p.handled}'
        f'</td><td class="num">{p.failed}</td><td class="num">{p.retried}</td><td class="num">{p.dead_lettered}'
        f'</td><td class="num">{"&ndash;" if p.lag is None else p.lag}</td></tr>'
        for p in reversed(series.points)
    )
    return mark_safe(  # numbers and times only
        '<table class="sq-numbers"><thead><tr><th>Bucket start (UTC)</th><th class="num">Published</th>'
        '<th class="num">Handled</th><th class="num">Failed</th><th class="num">Retried</th>'
        '<th class="num">Dead-lettered</th><th class="num">Lag (&ndash;: no sample)</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


#: The fragments of a group's page that the live refresh replaces (``data-live-html`` keys).
GROUP_FRAGMENTS: dict[str, Callable[[Series, Sequence[Marker]], SafeString]] = {
    "chart_throughput": throughput_chart,
    "chart_lag": lag_chart,
    "chart_numbers": lambda series, markers: numbers_table(series),
}


def group_fragments(series: Series, markers: Sequence[Marker] = ()) -> dict[str, SafeString]:
    """Every chart fragment of a group's page, by its ``data-live-html`` key."""
    return {key: render(series, markers) for key, render in GROUP_FRAGMENTS.items()}
