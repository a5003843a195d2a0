"""The console in a real headless Chromium (Debian's /usr/bin/chromium through Playwright):
log in, read the overview, replay a dead letter, and see a running runconsumer handle it."""

from __future__ import annotations

import os
import shutil

import pytest
from django.contrib.auth.models import User
from django.db import connections

from django_sqlqueue import ops

from ..processes.test_console import fail_then_replay_scenario, handled, runconsumer, wait_for  # noqa: F401

CHROMIUM = os.environ.get("SQLQUEUE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason=f"{CHROMIUM} is not installed (.ci/run installs it)"),
]


@pytest.fixture
def page(monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop on this thread; only for this test (monkeypatch
    # restores it), or later tests of async handlers would stop seeing SynchronousOnlyOperation.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        yield context.new_page()
        browser.close()
        # While Playwright's loop runs, Django's connections (asgiref Locals) belong to its
        # context, not the test's: close the one this test opened, or it stays open for the
        # rest of the session (PostgreSQL then refuses to drop the test database).
        connections.close_all()


def login(page, live_server) -> None:
    User.objects.create_superuser("ops", "ops@example.com", "secret-pw")
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "secret-pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#content")


def test_replay_a_dead_letter_from_the_browser(page, live_server, runconsumer):  # noqa: F811
    worker, flag, dead = fail_then_replay_scenario(runconsumer)
    login(page, live_server)
    page.click("text=Queue console")
    # The click returns once the navigation starts: wait for the page before reading its title.
    page.wait_for_selector("#groups")
    assert page.title().startswith("Queue overview")
    assert "c1" in page.inner_text("#groups") and "console.events" in page.inner_text("#groups")
    problems = page.inner_text("#problems")
    assert "topic console.handled is consumed by no group" in problems  # written by the handlers, read by none
    # Issue 29: c1's dead letter made its dead-letter topic a permanent "problem", and the
    # Topics table said it held 0; no group consumes a dead-letter topic by design.
    assert "console.events_dlq" not in problems
    dlq = page.locator("#topics tr", has_text="console.events_dlq").inner_text()
    assert "no group (by design)" in dlq and "until replayed or purged" in dlq and "1 held" in dlq
    page.click("text=Dead letters")
    page.click(f"a[href$='/deadletters/{dead.seq}/']")
    assert "scripted failure of m1 in c1" in page.inner_text("#traceback")
    os.unlink(flag)
    page.click("#replay-button")
    page.wait_for_selector(".messagelist")
    assert "Replayed 1 dead letter(s) (c1: 1)" in page.inner_text(".messagelist")
    assert "No dead letters match" in page.inner_text("#deadletters")
    got = wait_for(lambda: handled("c1"), 30, "runconsumer to handle the replay for c1", [worker])
    assert got[0]["replay"]["original_id"] == "m1" and got[0]["worker"] == "w1"
    assert ops.count_dead_letters() == 0


def test_dark_mode_and_narrow_screen(page, live_server):
    login(page, live_server)
    page.set_viewport_size({"width": 375, "height": 800})
    page.emulate_media(color_scheme="dark")
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/")
    page.wait_for_selector(".sq-tabs")
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    fg = page.evaluate("getComputedStyle(document.querySelector('.sq-tabs a')).color")
    assert bg != "rgb(255, 255, 255)" and fg != "rgb(0, 0, 0)"  # the admin's dark palette
    # Nothing wider than the screen: tables scroll inside their own box.
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375 + 1


def test_the_messages_page_explains_an_empty_log(page, live_server):
    """Issue 29: after a normal run (RETENTION 0) the page said only "No messages match"."""
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/messages/")
    note = page.inner_text("#retention-note")
    assert "Handled messages are not kept." in note and 'SQLQUEUE["RETENTION"]' in note and "7 days" in note
    assert page.locator("#retention-note").is_visible()
    assert "No messages match. Handled messages are garbage-collected" in page.inner_text("#messages")
