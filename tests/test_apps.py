"""apps.py: what the app does as Django starts it (``SQLQueueConfig.ready``).

It registers the system checks, and -- only when ``settings.TASKS`` names the queue's
backend -- the tasks backend's replay hook, without importing ``django.tasks``.
"""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.apps import apps as django_apps
from django.core import checks
from django.test import override_settings

from django_sqlqueue.apps import SQLQueueConfig, uses_tasks_backend


def test_the_app_config_registers_the_system_checks() -> None:
    config = django_apps.get_app_config("django_sqlqueue")
    assert isinstance(config, SQLQueueConfig)
    # ready() imported django_sqlqueue.checks: its checks are in Django's registry, tagged "sqlqueue",
    # but the one that reads the database (W003), tagged "database" only as Django's own are.
    ours = {
        c.__name__: c.tags for c in checks.registry.registry.get_checks() if c.__module__ == "django_sqlqueue.checks"
    }
    assert list(ours.pop("check_consumer_topics")) == [checks.Tags.database]
    assert ours and all("sqlqueue" in tags for tags in ours.values())


@pytest.mark.parametrize(
    ("tasks_setting", "expected"),
    [
        ({"default": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend"}}, True),
        (
            {
                "other": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
                "jobs": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["default"]},
            },
            True,
        ),
        ({"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}, False),
        # A path that merely starts like the package's name is not the package.
        ({"default": {"BACKEND": "django_sqlqueue.tasksx.Backend"}}, False),
        ({"default": "django_sqlqueue.tasks.SQLQueueBackend"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_uses_tasks_backend_reads_the_setting_as_text(tasks_setting: Any, expected: bool) -> None:
    with override_settings(TASKS=tasks_setting):
        assert uses_tasks_backend() is expected


@pytest.mark.parametrize(
    ("tasks_setting", "registered"),
    [
        ({"default": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["default"]}}, True),
        ({"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}, False),
        (None, False),
    ],
)
def test_the_app_registers_the_replay_hook_without_importing_django_tasks(
    tasks_setting: dict[str, Any] | None, registered: bool
) -> None:
    """In a process that never touches the backend (the console, queue_dlq): registered at
    start-up when TASKS names it, and neither the backend nor the backport is imported. On
    Django 6 the framework itself (django.tasks, a part of Django) is, when TASKS names the
    backend: that registers Django's tasks check, which runs the backend's check()."""
    import os
    import subprocess
    import sys

    code = f"""
import sys
import django
from django.conf import settings

extra = {{"TASKS": {tasks_setting!r}}} if {tasks_setting!r} is not None else {{}}
settings.configure(
    INSTALLED_APPS=["django_sqlqueue"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}},
    USE_TZ=True,
    **extra,
)
django.setup()
from django_sqlqueue.rules import dlq

print([h.__qualname__ for h in dlq._replay_hooks])
print(sorted(m for m in sys.modules if m == "django_tasks" or m.startswith(("django_tasks.", "django.tasks"))))
"""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    hooks, imported = out.stdout.strip().splitlines()
    assert hooks == ("['replay_task']" if registered else "[]")
    framework = ["django.tasks", "django.tasks.base", "django.tasks.checks", "django.tasks.exceptions"]
    framework.append("django.tasks.signals")
    assert imported == str(framework if registered and django.VERSION >= (6, 0) else [])
