"""Issue 32: the console's database switcher in a real headless Chromium: switch to the second
database, see its group, replay one of its dead letters there."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_sqlqueue.models import Message

from ..support import databases_scene
from ..support.databases_scene import GROUP, TOPICS, Scene, topics_of
from .test_browser import CHROMIUM, login, page  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(databases=["default", "second"], transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason=f"{CHROMIUM} is not installed (.ci/run installs it)"),
]

FIRST, SECOND = TOPICS["default"], TOPICS["second"]


@pytest.fixture
def scene(second_routes: None) -> Iterator[Scene]:
    conf = {**django_settings.SQLQUEUE, "TOPICS": databases_scene.SETTINGS_TOPICS, "HISTORY_RETENTION": 0}
    with override_settings(SQLQUEUE=conf):
        yield databases_scene.build()


def test_switch_database_and_replay_a_dead_letter_there(page, live_server, scene: Scene) -> None:  # noqa: F811
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqlqueue/queueconsole/overview/")
    page.wait_for_selector("#groups")
    assert FIRST in page.inner_text("#groups") and SECOND not in page.inner_text("#groups")
    assert page.inner_text("#sq-database-current") == "default"
    # Switch: the overview of the second database.
    page.select_option("#sq-database-select", "second")
    with page.expect_navigation():
        page.click("#sq-database-switch")
    page.wait_for_selector("#groups")
    assert page.inner_text("#sq-database-current") == "second"
    groups = page.inner_text("#groups")
    assert GROUP in groups and SECOND in groups and FIRST not in groups
    # The choice holds from tab to tab: the dead letters of the second database.
    page.click("nav.sq-tabs >> text=Dead letters")
    page.wait_for_selector("#deadletters")
    listed = page.inner_text("#deadletters")
    assert "second-0" in listed and "default-0" not in listed
    page.click(f"a[href*='/deadletters/{scene.dead['second']}/?db=second']")
    page.wait_for_selector("#replay-button")
    page.click("#replay-button")
    page.wait_for_selector(".messagelist")
    assert f"Replayed 1 dead letter(s) ({GROUP}: 1)" in page.inner_text(".messagelist")
    assert page.inner_text("#sq-database-current") == "second"
    assert topics_of("second") == [SECOND] * 4
    # The first database's dead letter is still there.
    assert Message.objects.using("default").filter(topic=f"{FIRST}_dlq").count() == 1
