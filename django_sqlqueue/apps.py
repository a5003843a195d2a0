from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings

#: Backends of ``settings.TASKS`` whose path starts with this are the queue's own.
TASKS_PACKAGE = "django_sqlqueue.tasks."


class SQLQueueConfig(AppConfig):
    name = "django_sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers the system checks)
            conf,  # noqa: F401  (connects setting_changed)
        )

        if uses_tasks_backend():
            self._register_task_replay()

    @staticmethod
    def _register_task_replay() -> None:
        # Here, not when the backend is first used: the console and ``queue_dlq replay``
        # may replay a dead task in a process that never touched the backend.
        from .consumers import register_spec_source
        from .rules.dlq import register_replay_hook
        from .tasks.discovery import task_consumer_specs
        from .tasks.replay import replay_task

        register_replay_hook(replay_task)
        # The console and queue_status show the task queues' consumer options (atomic).
        register_spec_source(task_consumer_specs)


def uses_tasks_backend() -> bool:
    """Return True when ``settings.TASKS`` configures a backend of ``django_sqlqueue.tasks``.

    A string check: importing the backend would import ``django.tasks`` (or the backport).
    """
    tasks: Any = getattr(settings, "TASKS", None) or {}
    if not isinstance(tasks, dict):
        return False
    return any(
        isinstance(params, dict) and str(params.get("BACKEND", "")).startswith(TASKS_PACKAGE)
        for params in tasks.values()
    )
