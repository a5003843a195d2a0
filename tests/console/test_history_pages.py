"""The console's history pages and live JSON, through Django's test client on real rows: the
overview's sparklines, a group's charts, window switch, summary and action markers, and the
JSON twins of the overview, a group's page and the dead letters (permission, shape, errors)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_sqlqueue import ops
from django_sqlqueue.console import live
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.models import HistoryMinute

from ..support.console_scene import build
from .test_admin import ACTION_PERMS, login, scene_settings, u  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


@pytest.fixture
def scene():
    return build()


@pytest.fixture
def viewer():
    return login("view_queue")


def history(group: str, topic: str, *rows: tuple[int, int, int]) -> None:
    """Samples ``(minutes ago, handled total, lag)`` of ``group`` on ``topic``."""
    now = QueueStore("default").now_minute()
    for ago, handled, lag in rows:
        HistoryMinute.objects.create(
            consumer_group=group, topic=topic, minute=now - ago, handled=handled, published=handled + lag, lag=lag
        )


def test_the_overview_has_a_sparkline_per_group_from_one_history_read(scene, viewer):
    history("billing", "orders", (3, 0, 50), (2, 30, 40), (1, 70, 20))
    with CaptureQueriesContext(connection) as queries:
        html = viewer.get(u("overview")).content.decode()
    assert sum("queue_history" in q["sql"] for q in queries.captured_queries) == 1
    assert html.count('class="sq-chart sq-spark"') == 3  # billing, shipping, retired on orders
    assert "billing on orders, last 1h: published 40, handled 70, failed 0, dead-lettered 0; lag 20" in html
    assert 'data-live="[&quot;billing&quot;, &quot;orders&quot;]:lag"' in html
    assert 'id="sq-live"' in html and "format=json" in html


def test_a_groups_page_shows_the_summary_the_charts_and_their_numbers(scene, viewer):
    history("billing", "orders", (30, 0, 0), (20, 100, 300), (10, 200, 200), (0, 400, 100))
    series = ops.group_history("billing", "orders", "1h")
    html = viewer.get(u("group", "billing", "orders")).content.decode()
    summary = ops.summarize(series).describe()
    assert summary.startswith("Behind since") and "catching up by 10/min" in summary
    assert f'id="history-summary" data-live="summary">{summary}</p>' in html
    assert 'id="chart-throughput"' in html and 'id="chart-lag"' in html and 'class="sq-numbers"' in html
    assert html.count('class="sq-hit"') == 120  # 60 buckets in each chart
    assert 'aria-current="page">1h</a>' in html
    at = series.points[-11].at
    assert f"{at:%Y-%m-%d %H:%M} UTC: published 0, handled 100, failed 0, retried 0, dead-lettered 0, lag 200" in html


@pytest.mark.parametrize("window, buckets", [("24h", 96), ("7d", 168)])
def test_the_window_switch(scene, viewer, window, buckets):
    history("billing", "orders", (200, 0, 5), (0, 10, 0))
    html = viewer.get(u("group", "billing", "orders") + f"?window={window}").content.decode()
    assert html.count('class="sq-hit"') == 2 * buckets
    assert f'aria-current="page">{window}</a>' in html and "Not behind" in html


def test_a_bad_window_falls_back_to_the_last_hour_and_says_so(scene, viewer):
    response = viewer.get(u("group", "billing", "orders") + "?window=1y<b>")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Unknown window &#x27;1y&lt;b&gt;&#x27;: showing the last hour (choose 1h, 24h, 7d)." in html
    assert html.count('class="sq-hit"') == 120
    json_response = viewer.get(u("group", "billing", "orders") + "?window=1y&format=json")
    assert json_response.status_code == 400 and "Unknown window" in json_response.json()["error"]


def test_an_operator_action_is_a_marker_on_the_groups_charts(scene):
    operator = login("view_queue", *ACTION_PERMS)
    operator.post(u("pause", "billing", "orders"), {"reason": "<deploy>"})
    html = operator.get(u("group", "billing", "orders")).content.decode()
    assert html.count('class="sq-marker"') == 2  # on the throughput and the lag chart
    assert "UTC: pause by user0: Paused billing on orders (1 topic).</title>" in html


def test_the_group_json_has_the_numbers_and_the_charts_only_when_they_changed(scene, viewer):
    history("billing", "orders", (2, 0, 9), (1, 5, 4))
    url = u("group", "billing", "orders") + "?format=json"
    with CaptureQueriesContext(connection) as queries:
        first = viewer.get(url)
    assert first.status_code == 200 and "no-store" in first["Cache-Control"]
    # The hour; behind for all of it, the 24 h and then 7 d windows say since when (ops.group_summary).
    assert sum("queue_history" in q["sql"] for q in queries.captured_queries) == 3
    body = first.json()
    assert set(body) == {"at", "v", "values", "html"}
    assert body["values"]["lag"] == "lag 4"  # the scene: 2 behind in each of 2 partitions
    assert body["values"]["p0:lag"] == "2" and body["values"]["summary"].startswith("Behind since")
    assert set(body["html"]) == {"chart_throughput", "chart_lag", "chart_numbers"}
    again = viewer.get(url + f"&v={body['v']}").json()
    assert again["html"] == {} and again["values"] == body["values"]
    history("billing", "orders", (0, 9, 0))  # a new sample: the charts are sent again
    changed = viewer.get(url + f"&v={body['v']}").json()
    assert changed["v"] != body["v"] and "chart_lag" in changed["html"]
    assert changed["values"]["summary"] == "Not behind: every message published was handled."
    assert len(first.content) < 60_000


def test_the_overview_json_is_small_and_keyed_by_row(scene, viewer):
    history("billing", "orders", (1, 3, 4))
    body = viewer.get(u("overview") + "?format=json").json()
    key = live.row_key("billing", "orders")
    assert body["values"][f"{key}:lag"] == "4" and body["values"][f"{key}:dead_letters"] == "3"
    assert body["values"][f"{key}:subscribers"] == "1"
    assert f"spark:{key}" in body["html"]
    assert viewer.get(u("overview") + f"?format=json&v={body['v']}").json()["html"] == {}


def test_the_dead_letters_json_counts_the_matching_and_the_newer(scene, viewer):
    html = viewer.get(u("deadletters") + "?group=billing").content.decode()
    assert '<span data-live="dl_count">3</span> dead letter(s) match' in html
    assert f"top={scene.dead[2]}" in html
    body = viewer.get(u("deadletters") + f"?group=billing&format=json&top={scene.dead[0]}").json()
    assert body["values"] == {"dl_count": "3", "dl_newer": "2 newer than this page: reload to list them."}
    assert "payload" not in json.dumps(body)
    bad = viewer.get(u("deadletters") + "?failed_after=yesterday&format=json")
    assert bad.status_code == 400 and "failed after" in bad.json()["error"]


@pytest.mark.parametrize(
    "name, args",
    [("overview", ()), ("group", ("billing", "orders")), ("deadletters", ())],
)
def test_the_json_twins_need_the_view_permission(scene, name, args):
    assert login(*ACTION_PERMS).get(u(name, *args) + "?format=json").status_code == 403
    response = login("view_queue", staff=False).get(u(name, *args) + "?format=json")
    assert response.status_code == 302 and "/login/" in response["Location"]  # the admin's own gate


def test_the_group_page_says_when_the_history_is_off(scene, viewer, settings):
    settings.SQLQUEUE = {**settings.SQLQUEUE, "HISTORY_RETENTION": 0}
    html = viewer.get(u("group", "billing", "orders")).content.decode()
    assert "The history is off (SQLQUEUE[&quot;HISTORY_RETENTION&quot;] is 0)" in html
