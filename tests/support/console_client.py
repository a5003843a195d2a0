"""Clients of the operator console for the tests: a staff user with some of its permissions."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse


def u(name: str, *args: object) -> str:
    """The URL of the console's page ``name`` (``admin:django_sqlqueue_queueconsole_<name>``)."""
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}", args=args)


def login(*perms: str, staff: bool = True) -> Client:
    """A client logged in as a new user with the console permissions ``perms`` (codenames)."""
    user = User.objects.create_user(f"user{User.objects.count()}", password="pw", is_staff=staff)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_sqlqueue", codename__in=perms))
    client = Client()
    client.force_login(user)
    return client
