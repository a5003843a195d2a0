"""Issue 32: the console with the queue in two databases (``second.*`` in ``second``).

A switcher (``?db=<alias>``, kept in the session, carried by every action form) chooses
the database every page reads and every action writes; an unknown alias is a 404; the
action log says which database an action changed. Permissions are unchanged.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from django_sqlqueue.models import PausedTopic

from ..support.console_client import login, u
from ..support.databases_scene import GROUP, TOPICS, Scene, topics_of

# transaction=True: an action's audit entry is written when its batch commits (console/auditing.py).
pytestmark = pytest.mark.django_db(databases=["default", "second"], transaction=True)

FIRST, SECOND = TOPICS["default"], TOPICS["second"]


@pytest.fixture
def scene(two_databases: Scene) -> Scene:
    return two_databases


@pytest.fixture
def operator() -> Client:
    return login("view_queue", "pause_group", "replay_deadletter")


def test_one_database_has_no_switcher() -> None:
    client = login("view_queue")
    page = client.get(u("overview")).content.decode()
    assert 'id="sq-database"' not in page
    assert client.get(u("overview") + "?db=anything").status_code == 200  # nothing to choose: ignored


def test_the_switcher_chooses_the_database_of_every_page(scene: Scene, operator: Client) -> None:
    page = operator.get(u("overview")).content.decode()
    assert 'id="sq-database"' in page and '<option value="second">second</option>' in page
    assert FIRST in page and SECOND not in page  # SQLQUEUE["DATABASE"] first
    page = operator.get(u("overview") + "?db=second").content.decode()
    assert SECOND in page and FIRST not in page
    assert '<option value="second" selected>' in page
    # Kept in the session: the next pages (no ?db=) read the same database.
    assert SECOND in operator.get(u("groups")).content.decode()
    assert "bad in second" in operator.get(u("deadletters")).content.decode()
    page = operator.get(u("deadletter", scene.dead["second"])).content.decode()
    assert "bad in second" in page and '<input type="hidden" name="db" value="second">' in page
    assert "bad in default" in operator.get(u("deadletter", scene.dead["default"]) + "?db=default").content.decode()
    assert FIRST in operator.get(u("overview")).content.decode()
    # The Tasks tab is of SQLQUEUE["DATABASE"] whatever the choice: no switcher there.
    operator.get(u("overview") + "?db=second")
    tasks = operator.get(u("tasks"))
    assert tasks.status_code == 200 and 'id="sq-database"' not in tasks.content.decode()
    assert SECOND in operator.get(u("overview")).content.decode()  # and the choice is kept


def test_an_unknown_database_is_a_404_naming_the_known_ones(scene: Scene, operator: Client) -> None:
    assert operator.get(u("overview") + "?db=third").status_code == 404
    response = operator.post(u("pause", GROUP, FIRST), {"action": "pause", "db": "third"})
    assert response.status_code == 404 and not PausedTopic.objects.using("default").exists()


def test_actions_act_on_the_posted_database_and_the_log_says_which(scene: Scene, operator: Client) -> None:
    operator.get(u("overview") + "?db=default")  # the session says default: the form says second
    response = operator.post(u("pause", GROUP, SECOND), {"action": "pause", "reason": "deploy", "db": "second"})
    assert response.status_code == 302
    assert list(PausedTopic.objects.using("second").values_list("topic", flat=True)) == [SECOND]
    assert not PausedTopic.objects.using("default").exists()
    entry = LogEntry.objects.get()
    assert entry.change_message.endswith("[database second]")

    seq = scene.dead["second"]
    response = operator.post(u("deadletter_action"), {"action": "replay", "seq": str(seq), "db": "second"})
    assert response.status_code == 302
    assert topics_of("second") == [SECOND] * 4  # the replayed copy, in second
    assert f"{FIRST}_dlq" in topics_of("default")  # default's dead letter (maybe the same seq) untouched
    assert LogEntry.objects.filter(change_message__contains="[database second]").count() == 2


def test_permissions_are_unchanged(scene: Scene) -> None:
    viewer = login("view_queue")
    assert viewer.get(u("overview") + "?db=second").status_code == 200
    assert viewer.post(u("pause", GROUP, SECOND), {"action": "pause", "db": "second"}).status_code == 403
    assert not PausedTopic.objects.using("second").exists()
    assert login().get(u("overview") + "?db=second").status_code == 403
