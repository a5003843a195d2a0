"""Search in a real headless Chromium (issue 31, item 4): find messages by a field of their JSON
payload, and replay every dead letter matching a payload search from the Dead letters page,
through its confirmation page."""

from __future__ import annotations

import shutil

import pytest
from django.test import override_settings

from django_sqlqueue import ops, publish_many

from ..support.console_scene import SETTINGS, build, dead_letter
from .test_browser import CHROMIUM, login, page  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason=f"{CHROMIUM} is not installed (.ci/run installs it)"),
]

CONSOLE = "/admin/django_sqlqueue/queueconsole"


@pytest.fixture(autouse=True)
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


def test_search_messages_by_a_payload_field(page, live_server):  # noqa: F811
    publish_many(
        "shop",
        [{"payload": {"order_id": n % 5, "customer": {"id": f"c-{n}"}}, "id": f"s{n}"} for n in range(20)]
        + [{"payload": {"order_id": "3"}, "id": "text3"}],
    )
    login(page, live_server)
    page.goto(f"{live_server.url}{CONSOLE}/messages/")
    page.select_option("select[name=topic]", "shop")
    page.fill("input[name=field]", "order_id")
    page.fill("input[name=value]", "3")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("form.sq-filters input[type=submit]")
    page.wait_for_selector("#messages")
    ids = page.locator("#messages tbody tr td:nth-child(6)").all_inner_texts()
    assert sorted(ids) == ["s13", "s18", "s3", "s8"]  # the number 3, not the string "3"
    assert "order_id = 3" in page.inner_text("#search-window")
    page.fill("input[name=field]", "customer.id")
    page.fill("input[name=value]", "c-7")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("form.sq-filters input[type=submit]")
    page.wait_for_selector("#messages")
    assert page.locator("#messages tbody tr td:nth-child(6)").all_inner_texts() == ["s7"]
    page.fill("input[name=field]", "customer id")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("form.sq-filters input[type=submit]")
    assert "is not a key name" in page.inner_text(".errornote")


def test_replay_every_dead_letter_matching_a_payload_search(page, live_server):  # noqa: F811
    build()
    for name, order in [("p1", 7), ("p2", 7), ("p3", "7"), ("p4", 8)]:
        dead_letter("billing", name, payload={"order_id": order})
    login(page, live_server)
    page.goto(f"{live_server.url}{CONSOLE}/deadletters/")
    page.fill("input[name=field]", "order_id")
    page.fill("input[name=value]", "7")
    with page.expect_navigation():  # the same page again: wait for the new one
        page.click("form.sq-filters input[type=submit]")
    page.wait_for_selector("#deadletters")
    listed = page.locator("#deadletters tbody tr td:nth-child(5)").all_inner_texts()
    assert sorted(listed) == ["p1", "p2"]
    page.check("input[name=scope][value=matching]")
    page.select_option("#dl-action", "replay")
    page.click("#dl-go")
    page.wait_for_selector("#confirm")
    summary = page.inner_text("#confirm-summary")
    assert "Replay 2 dead letter(s)" in summary and "payload order_id = 7" in summary
    page.click("#confirm-button")
    page.wait_for_selector(".messagelist")
    assert "Replayed 2 dead letter(s)" in page.inner_text(".messagelist")
    left = sorted(d.original_id for d in ops.list_dead_letters().items)
    assert left == ["o0", "o1", "o2", "o7", "p3", "p4"]
