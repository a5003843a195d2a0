"""The ``django.tasks`` API: built into Django 6.0+, the ``django-tasks`` backport on 5.2.

Everything the backend needs is imported from here, so the rest of the package does not
care which one is installed. On Django 5.2 install the extra: ``pip install
django-sqlqueue[tasks]``.
"""

from __future__ import annotations

from typing import Any

try:  # Django >= 6.0
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    BUILTIN = True
except ImportError:  # Django 5.2 + the django-tasks backport
    try:
        from django_tasks import DEFAULT_TASK_QUEUE_NAME, task_backends  # type: ignore[no-redef]
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import (  # type: ignore[no-redef]
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend  # type: ignore[no-redef]
        from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
        from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
        from django_tasks.utils import normalize_json  # type: ignore[no-redef]
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from ..exceptions import ConfigurationError

        raise ConfigurationError(
            "django_sqlqueue.tasks needs django.tasks: Django >= 6.0, or on Django 5.2 the backport "
            "(pip install 'django-sqlqueue[tasks]', which installs django-tasks)."
        ) from exc
    BUILTIN = False


def set_field(obj: Any, name: str, value: Any) -> None:
    """Set a field of the frozen ``TaskResult`` dataclass (as Django's own backends do)."""
    object.__setattr__(obj, name, value)


__all__ = [
    "BUILTIN",
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "set_field",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
