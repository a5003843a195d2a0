"""Run by ``test_custom_user.py`` in a subprocess with ``tests.support.settings_custom_user``
(a user model keyed by a string): not collected by the suite itself (no ``test_`` prefix),
since ``AUTH_USER_MODEL`` cannot change inside one test process."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client, override_settings
from django.urls import reverse

from django_sqlqueue.models import PausedTopic

from ..support.console_scene import SETTINGS, build

pytestmark = pytest.mark.django_db


def test_a_console_action_is_audited_under_a_string_primary_key():
    user_model = get_user_model()
    assert user_model._meta.label == "customuserapp.Operator"
    user = user_model.objects.create(username="alice", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=["view_queue", "pause_group"])
    )
    client = Client()
    client.force_login(user)
    with override_settings(SQLQUEUE=SETTINGS):
        build()
        response = client.post(
            reverse("admin:django_sqlqueue_queueconsole_pause", args=["billing", "orders"]), {"reason": "deploy"}
        )
    assert response.status_code == 302
    assert PausedTopic.objects.get().reason == "deploy"
    entry = LogEntry.objects.get()
    assert (entry.user_id, entry.action_flag) == ("alice", CHANGE)
    assert entry.change_message == "Paused billing on orders (1 topic)."
