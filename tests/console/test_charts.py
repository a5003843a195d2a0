"""The console's SVG charts (django_sqlqueue/console/charts.py): the numbers of the hover
titles and of the table are the series' own, buckets without a lag sample are gaps, markers
land at their time with their label, and every outside text is escaped."""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET

import pytest

from django_sqlqueue import ops
from django_sqlqueue.console import charts
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.models import HistoryMinute
from django_sqlqueue.ops.history import Point, Series

SVG = "{http://www.w3.org/2000/svg}"
START = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)


def series(points: list[Point], *, group: str = "billing", topic: str = "orders", step: int = 1) -> Series:
    return Series(group, topic, "1h", step, points)


def sample_points() -> list[Point]:
    at = [START + dt.timedelta(minutes=i) for i in range(6)]
    return [
        Point(at[0], 10, 8, 1, 1, 0, 5),
        Point(at[1], 12, 12, 0, 0, 0, 5),
        Point(at[2]),  # no sample: a gap
        Point(at[3], 20, 9, 3, 2, 1, 15),
        Point(at[4], 0, 15, 0, 0, 0, 0),
        Point(at[5], 4, 4, 0, 0, 2, 0),
    ]


def parse(markup: str) -> ET.Element:
    # Inline SVG is served in HTML without a namespace; parse it as XML with the SVG one.
    return ET.fromstring(markup.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))


def hover_titles(markup: str) -> list[str]:
    root = parse(markup)
    return [r.find(f"{SVG}title").text for r in root.iter(f"{SVG}rect") if "sq-hit" in r.get("class", "")]


@pytest.mark.parametrize("render", [charts.throughput_chart, charts.lag_chart])
def test_every_bucket_has_a_hover_title_with_its_numbers(render):
    s = series(sample_points())
    titles = hover_titles(render(s))
    assert len(titles) == len(s.points)
    for title, p in zip(titles, s.points, strict=True):
        numbers = dict(re.findall(r"(published|handled|failed|retried|dead-lettered|lag) (\d+|no sample)", title))
        assert numbers == {
            "published": str(p.published),
            "handled": str(p.handled),
            "failed": str(p.failed),
            "retried": str(p.retried),
            "dead-lettered": str(p.dead_lettered),
            "lag": "no sample" if p.lag is None else str(p.lag),
        }
        assert title.startswith(f"{p.at:%Y-%m-%d %H:%M} UTC")


def test_the_table_has_the_series_numbers_newest_first():
    s = series(sample_points())
    root = ET.fromstring(str(charts.numbers_table(s)).replace("&ndash;", "-"))
    rows = [[td.text for td in tr.findall("td")] for tr in root.find("tbody").findall("tr")]
    expected = [
        [
            f"{p.at:%Y-%m-%d %H:%M} UTC",
            *map(str, (p.published, p.handled, p.failed, p.retried, p.dead_lettered)),
            "-" if p.lag is None else str(p.lag),
        ]
        for p in reversed(s.points)
    ]
    assert rows == expected


def test_the_bars_stack_handled_failed_and_dead_lettered_to_the_scale():
    s = series(sample_points())
    root = parse(charts.throughput_chart(s))
    bars = {
        cls: [r for r in root.iter(f"{SVG}rect") if r.get("class") == cls]
        for cls in ("sq-handled", "sq-failed", "sq-dead")
    }
    assert len(bars["sq-handled"]) == 5 and len(bars["sq-failed"]) == 2 and len(bars["sq-dead"]) == 2
    # The top label is the largest bucket (published 20 at 12:03), and a bar's height is proportional.
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert "20" in labels and "0" in labels and "time (UTC)" in labels and "12:00" in labels
    plot_h = charts.THROUGHPUT_HEIGHT - charts.TOP - charts.BOTTOM
    heights = [float(r.get("height")) for r in bars["sq-handled"]]
    assert heights[1] == pytest.approx(plot_h * 12 / 20, abs=0.1)  # 12 handled at 12:01


def test_a_bucket_without_a_lag_sample_breaks_the_lag_line():
    s = series(sample_points())
    root = parse(charts.lag_chart(s))
    lines = [p for p in root.iter(f"{SVG}polyline") if p.get("class") == "sq-lag"]
    # Buckets 0-1, then the gap at 2, then 3-5: two separate lines, the gap shaded.
    assert [len(p.get("points").split()) for p in lines] == [2, 3]
    assert len([r for r in root.iter(f"{SVG}rect") if r.get("class") == "sq-nodata"]) == 1
    spark = parse(charts.sparkline(s))
    assert len([p for p in spark.iter(f"{SVG}polyline") if p.get("class") == "sq-lag"]) == 2


def test_a_lone_sample_between_gaps_is_a_dot():
    points = [Point(START), Point(START + dt.timedelta(minutes=1), lag=7), Point(START + dt.timedelta(minutes=2))]
    root = parse(charts.lag_chart(series(points)))
    assert len(list(root.iter(f"{SVG}circle"))) == 1 and not list(root.iter(f"{SVG}polyline"))


def test_markers_are_drawn_at_their_time_with_their_label_and_outside_ones_left_out():
    s = series(sample_points())
    markers = [
        (START + dt.timedelta(minutes=3), "pause by ops: Paused billing on orders (1 topic)."),
        (START - dt.timedelta(hours=2), "seek by ops: long ago"),
    ]
    for render in (charts.throughput_chart, charts.lag_chart):
        root = parse(render(s, markers))
        groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "sq-marker"]
        assert len(groups) == 1
        assert (
            groups[0].find(f"{SVG}title").text
            == "2026-11-28 12:03 UTC: pause by ops: Paused billing on orders (1 topic)."
        )
        line = groups[0].find(f"{SVG}line")
        # 3 of 6 minutes into the window: half-way across the plot.
        assert float(line.get("x1")) == pytest.approx(
            charts.LEFT + (charts.WIDTH - charts.LEFT - charts.RIGHT) / 2, abs=0.1
        )


def test_names_and_labels_are_escaped():
    evil = '<script>alert("x")</script>&'
    s = series(sample_points(), group=evil, topic="t'\"><b>")
    markers = [(START + dt.timedelta(minutes=1), evil)]
    for markup in (charts.sparkline(s), charts.throughput_chart(s, markers), charts.lag_chart(s, markers)):
        assert "<script>" not in markup and "<b>" not in markup
        root = parse(markup)  # well-formed: every attribute and text escaped
        assert evil in root.get("aria-label") or evil in "".join(t.text or "" for t in root.iter(f"{SVG}title"))


def test_the_charts_scale_to_their_box_and_use_css_variables_only():
    s = series(sample_points())
    for markup in (charts.sparkline(s), charts.throughput_chart(s), charts.lag_chart(s)):
        root = parse(markup)
        assert root.get("viewBox") and "sq-chart" in root.get("class")
        assert "fill=" not in markup and "stroke=" not in markup and "#" not in markup  # colours come from style.css


def test_the_sparkline_title_says_the_totals():
    s = series(sample_points())
    title = parse(charts.sparkline(s)).find(f"{SVG}title").text
    assert title == (
        "billing on orders, last 1h: published 46, handled 48, failed 4, dead-lettered 3; lag 0 (highest 15)"
    )


@pytest.mark.django_db
def test_a_chart_of_real_history_rows_shows_their_figures():
    now = QueueStore("default").now_minute()
    for k, (handled, lag) in enumerate([(0, 40), (25, 30), (60, 10)]):
        HistoryMinute.objects.create(consumer_group="g", topic="t", minute=now - 2 + k, handled=handled, lag=lag)
    s = ops.group_history("g", "t", "1h")
    titles = hover_titles(charts.throughput_chart(s))
    assert "handled 25," in titles[-2] and "lag 30" in titles[-2]
    assert "handled 35," in titles[-1] and "lag 10" in titles[-1]
    assert titles[0].endswith("lag no sample")
