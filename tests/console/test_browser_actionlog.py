"""The action log in a real headless Chromium: pause a group from its page, then find the pause in
the Action log tab, through the group page's link and through the filter form (issue 31, item 5)."""

from __future__ import annotations

import shutil

import pytest
from django.test import override_settings

from ..support.console_scene import SETTINGS, build
from .test_browser import CHROMIUM, login, page  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason=f"{CHROMIUM} is not installed (.ci/run installs it)"),
]


@pytest.fixture(autouse=True)
def scene():
    with override_settings(SQLQUEUE={**SETTINGS, "HISTORY_RETENTION": 0}):
        yield build()


def pause_from_the_group_page(page, live_server, group: str, reason: str) -> None:  # noqa: F811
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/groups/{group}/orders/")
    page.fill("input[name=reason]", reason)
    page.click("input[value='Pause consumption']")
    page.wait_for_selector(".messagelist")
    assert f"Paused {group} on orders." in page.inner_text(".messagelist")


def test_a_pause_shows_in_the_action_log_and_its_filters(page, live_server):  # noqa: F811
    login(page, live_server)
    pause_from_the_group_page(page, live_server, "billing", "deploy")
    pause_from_the_group_page(page, live_server, "shipping", "incident")
    # The tab: both pauses, newest first, by the logged-in user.
    page.click("nav.sq-tabs >> text=Action log")
    page.wait_for_selector("#actionlog")  # the click returns once the navigation starts
    assert page.title().startswith("Action log")
    rows = page.locator("#actionlog tbody tr")
    assert rows.count() == 2
    assert "Paused shipping on orders (1 topic)." in rows.nth(0).inner_text()
    first = rows.nth(1).inner_text()
    assert "Paused billing on orders (1 topic)." in first and "ops" in first and "pause" in first
    # The filter form: one group.
    page.fill("#actionlog-filters input[name=group]", "billing")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("#actionlog-filters input[type=submit]")
    page.wait_for_selector("#actionlog-window")
    assert rows.count() == 1 and "Paused billing on orders" in rows.nth(0).inner_text()
    page.select_option("#actionlog-filters select[name=kind]", "seek")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("#actionlog-filters input[type=submit]")
    page.wait_for_selector("#actionlog")
    assert "No action matches." in page.inner_text("#actionlog")
    # The group page's link opens the log filtered on that group and topic.
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/groups/shipping/orders/")
    page.click("#group-actionlog")
    page.wait_for_selector("#actionlog")
    assert page.input_value("#actionlog-filters input[name=group]") == "shipping"
    assert page.input_value("#actionlog-filters input[name=topic]") == "orders"
    assert rows.count() == 1 and "Paused shipping on orders" in rows.nth(0).inner_text()
    # The group cell links back to the group's page.
    page.click("#actionlog tbody a")
    page.wait_for_selector("#offsets")
    assert page.title().startswith("Group shipping on orders")
