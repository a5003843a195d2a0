"""admin.py: the console's entry in the Django admin -- its routes and who may see it.

The pages themselves (what they show and do): tests/console/.
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client, RequestFactory
from django.urls import reverse

from django_sqlqueue.admin import QueueConsoleAdmin
from django_sqlqueue.models import QueueConsole

pytestmark = pytest.mark.django_db

PREFIX = "admin:django_sqlqueue_queueconsole_"


def staff(name: str, *codenames: str, superuser: bool = False) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=True, is_superuser=superuser)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=codenames)
    )
    return User.objects.get(pk=user.pk)  # permissions are cached per instance


def test_the_console_is_registered_with_the_default_admin_site_under_every_route() -> None:
    assert isinstance(admin.site._registry[QueueConsole], QueueConsoleAdmin)
    assert reverse(PREFIX + "changelist") == "/admin/django_sqlqueue/queueconsole/"
    assert reverse(PREFIX + "message", args=[7]) == "/admin/django_sqlqueue/queueconsole/messages/7/"
    assert reverse(PREFIX + "seek", args=["billing", "orders"]) == (
        "/admin/django_sqlqueue/queueconsole/groups/billing/orders/seek/"
    )


def test_the_view_permission_opens_the_console_and_nothing_is_ever_added_changed_or_deleted() -> None:
    model_admin = admin.site._registry[QueueConsole]
    request = RequestFactory().get("/")
    for user, sees in (
        (staff("plain"), False),
        (staff("viewer", "view_queue"), True),
        (staff("root", superuser=True), True),
    ):
        request.user = user
        assert model_admin.has_module_permission(request) is sees
        assert model_admin.has_view_permission(request) is sees
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)


def test_every_route_is_behind_the_admin_login_and_refuses_nul() -> None:
    client = Client()
    assert client.get(reverse(PREFIX + "topics")).status_code == 302  # to the admin's login
    client.force_login(staff("viewer", "view_queue"))
    assert client.get(reverse(PREFIX + "topics")).status_code == 200
    assert client.get(reverse(PREFIX + "topics"), {"q": "a\x00b"}).status_code == 400
