"""The history charts and the live pages in a real headless Chromium: a group's page shows its
charts and the "since when behind" summary; the overview, a group's page and the dead
letters update their numbers in place after real changes in the database (no navigation);
the pause toggle stops that and is remembered; dark mode and a narrow screen render the charts."""

from __future__ import annotations

import json
import time

import pytest

from django_sqlqueue import publish_many
from django_sqlqueue.console.live import row_key
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.models import HistoryMinute

from ..support.console_scene import SETTINGS, build, dead_letter
from .test_browser import login, page, pytestmark  # noqa: F401

#: Longest wait for a live update (polls every 5 s).
LIVE_WAIT_MS = 15_000


@pytest.fixture
def scene(settings):
    settings.SQLQUEUE = SETTINGS
    return build()


def history(*rows: tuple[int, int, int], now: int | None = None) -> None:
    """Samples of billing on orders: ``(minutes ago, handled total, lag)``, counted back from the
    minute ``now`` (default: the database's current minute)."""
    if now is None:
        now = QueueStore("default").now_minute()
    for ago, handled, lag in rows:
        HistoryMinute.objects.update_or_create(
            consumer_group="billing",
            topic="orders",
            minute=now - ago,
            defaults={"handled": handled, "published": handled + lag, "lag": lag},
        )


def cell(key: str) -> str:
    return f"[data-live={json.dumps(key)}]"


def group_url(live_server, window: str = "") -> str:
    return f"{live_server.url}/admin/django_sqlqueue/queueconsole/groups/billing/orders/" + (
        f"?window={window}" if window else ""
    )


def mark_page(page) -> None:  # noqa: F811
    """Set a marker on ``window``: still there later means the page was not reloaded."""
    page.evaluate("window.__sqNoReload = 'still here'")


def assert_not_reloaded(page) -> None:  # noqa: F811
    assert page.evaluate("window.__sqNoReload") == "still here"


def test_the_group_page_shows_its_charts_and_summary(page, live_server, scene):  # noqa: F811
    history((40, 0, 0), (30, 100, 500), (10, 400, 300), (0, 700, 100))
    login(page, live_server)
    page.goto(group_url(live_server))
    summary = page.inner_text("#history-summary")
    assert summary.startswith("Behind since") and "catching up by" in summary and "min to go" in summary
    assert page.locator("#chart-throughput svg.sq-throughput").is_visible()
    assert page.locator("#chart-lag svg circle.sq-lag-dot").count() == 4  # lone samples between gaps
    assert page.locator("#chart-throughput rect.sq-handled").count() == 3
    page.click("text=The charts’ numbers")
    assert page.locator("#chart-numbers tbody tr").count() == 60
    page.click(".sq-windows >> text=7d")
    page.wait_for_url("**window=7d")
    assert page.locator("#chart-numbers tbody tr").count() == 168


def test_live_pages_update_in_place_and_the_toggle_pauses_them(page, live_server, scene):  # noqa: F811
    login(page, live_server)
    page.evaluate("window.localStorage.clear()")
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/overview/")
    lag = cell(f"{row_key('billing', 'orders')}:lag")
    assert page.inner_text(lag) == "4"
    mark_page(page)
    publish_many("orders", [{"payload": {"n": i}, "key": "k1"} for i in range(3)])
    sequence("orders")
    page.wait_for_function(f"document.querySelector({json.dumps(lag)}).textContent === '7'", timeout=LIVE_WAIT_MS)
    assert_not_reloaded(page)
    assert "Live: updated" in page.inner_text("#sq-live-status")

    # Paused: nothing changes, across a reload too (localStorage), until resumed.
    page.click("#sq-live-toggle")
    assert page.inner_text("#sq-live-toggle") == "Resume live updates"
    publish_many("orders", [{"payload": {"n": 9}, "key": "k1"}])
    sequence("orders")
    time.sleep(7)
    assert page.inner_text(lag) == "7"
    page.reload()
    assert page.inner_text("#sq-live-toggle") == "Resume live updates" and page.inner_text(lag) == "8"
    mark_page(page)
    publish_many("orders", [{"payload": {"n": 10}, "key": "k1"}])
    sequence("orders")
    time.sleep(7)
    assert page.inner_text(lag) == "8"
    page.click("#sq-live-toggle")
    page.wait_for_function(f"document.querySelector({json.dumps(lag)}).textContent === '9'", timeout=LIVE_WAIT_MS)
    assert_not_reloaded(page)


def test_the_group_page_redraws_its_summary_and_charts_live(page, live_server, scene):  # noqa: F811
    # Both writes count from one minute: had the minute turned between them (the page loads in
    # between, seconds on a loaded machine), the new sample would sit two minutes after the
    # last one, and the lag line would stay lone samples (a CI rehearsal failed so).
    minute = QueueStore("default").now_minute()
    history((5, 0, 0), (1, 10, 0), now=minute)
    login(page, live_server)
    page.evaluate("window.localStorage.clear()")
    page.goto(group_url(live_server))
    assert page.inner_text("#history-summary").startswith("Not behind")
    assert page.locator("#chart-lag circle, #chart-lag polyline").count() == 2  # two lone samples
    mark_page(page)
    history((0, 20, 250), now=minute)
    page.wait_for_function(
        "document.getElementById('history-summary').textContent.startsWith('Behind since')", timeout=LIVE_WAIT_MS
    )
    page.wait_for_function("document.querySelectorAll('#chart-lag polyline.sq-lag').length === 1", timeout=LIVE_WAIT_MS)
    assert "lag 250" in page.inner_html("#chart-lag")
    assert page.inner_text(cell("p0:lag")) == "2"
    assert_not_reloaded(page)


def test_the_dead_letters_page_counts_new_ones_live(page, live_server, scene):  # noqa: F811
    login(page, live_server)
    page.evaluate("window.localStorage.clear()")
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/deadletters/?group=billing")
    assert page.inner_text(cell("dl_count")) == "3"
    mark_page(page)
    dead_letter("billing", "o19")
    page.wait_for_function(
        f"document.querySelector({json.dumps(cell('dl_count'))}).textContent === '4'", timeout=LIVE_WAIT_MS
    )
    assert "1 newer than this page" in page.inner_text("#dl-live")
    assert_not_reloaded(page)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_charts_in_dark_mode_and_on_a_narrow_screen(page, live_server, scene, scheme):  # noqa: F811
    history((30, 0, 10), (20, 50, 30), (0, 90, 5))
    login(page, live_server)
    page.set_viewport_size({"width": 375, "height": 800})
    page.emulate_media(color_scheme=scheme)
    for url in (group_url(live_server, "24h"), f"{live_server.url}/admin/django_sqlqueue/queueconsole/"):
        page.goto(url)
        page.wait_for_selector("svg.sq-chart")
        assert page.evaluate("document.documentElement.scrollWidth") <= 375 + 1
    page.goto(group_url(live_server))
    box = page.locator("#chart-throughput svg").bounding_box()
    assert box and 200 < box["width"] <= 375 and box["height"] > 50
    fill = page.evaluate("getComputedStyle(document.querySelector('#chart-throughput rect.sq-handled')).fill")
    label = page.evaluate("getComputedStyle(document.querySelector('#chart-throughput text.sq-label')).fill")
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    expected = {"light": "rgb(47, 122, 184)", "dark": "rgb(108, 180, 238)"}[scheme]
    assert fill == expected and label != bg
