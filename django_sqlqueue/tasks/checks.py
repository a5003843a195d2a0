"""Which ``TASKS`` aliases are this backend's, and making sure ``manage.py check`` checks them.

The checks themselves are :meth:`SQLQueueBackend.check` (unknown and invalid ``OPTIONS``,
the app missing from ``INSTALLED_APPS``). The tasks framework's system check runs it for
every backend -- Django 6's, registered when ``django.tasks`` is first imported, and the
backport's, registered by its app ``django_tasks`` -- but only if registered before the
checks run. This module is imported by the app's ``ready()`` (through ``discovery.py``)
when ``TASKS`` names the backend, and closes both gaps: on Django 6 it imports
``django.tasks`` now (a part of Django, cheap); on Django 5.2 without ``django_tasks`` in
``INSTALLED_APPS`` its own check, :func:`check_task_backends`, runs the backends' checks.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import django
from django.apps import AppConfig, apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

BACKEND_PATH = "django_sqlqueue.tasks.SQLQueueBackend"
#: ``TASKS`` names the backend but ``django.tasks`` cannot be imported (Django 5.2 without the backport).
NO_TASKS_FRAMEWORK = "sqlqueue.tasks.E004"
#: Django 6 has ``django.tasks``: its system check runs every backend's ``check()``.
BUILTIN = django.VERSION >= (6, 0)

if BUILTIN:
    importlib.import_module("django.tasks")  # registers Django's tasks check before any check runs


def configured_aliases() -> list[str]:
    """Aliases of ``settings.TASKS`` whose backend is :class:`~django_sqlqueue.tasks.SQLQueueBackend`."""
    tasks: Any = getattr(settings, "TASKS", None) or {}
    if not isinstance(tasks, dict):
        return []
    return [
        alias for alias, params in tasks.items() if isinstance(params, dict) and params.get("BACKEND") == BACKEND_PATH
    ]


@checks.register("sqlqueue")
def check_task_backends(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Run the backends' checks when the tasks framework does not (Django 5.2 without ``django_tasks``)."""
    aliases = configured_aliases()
    if BUILTIN or not aliases or apps.is_installed("django_tasks"):
        return []  # none of ours, or the framework's own check runs them
    try:
        from .compat import task_backends
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id=NO_TASKS_FRAMEWORK)]
    messages: list[checks.CheckMessage] = []
    for alias in aliases:
        messages += task_backends[alias].check()
    return messages
