"""The backend when ``django_sqlqueue`` is not in ``INSTALLED_APPS``: a check error, not a traceback.

The real backend cannot even be imported then (its modules import the queue's models,
which Django refuses to load outside an installed app). Yet Django imports it as soon as
a ``@task`` is declared or ``manage.py check`` runs the tasks check. So the package's
``SQLQueueBackend`` (``django_sqlqueue/tasks/__init__.py``) is this stand-in while the app
is missing: its :meth:`~AppMissingBackend.check` reports ``sqlqueue.tasks.E003``, tasks
can still be declared, and enqueuing raises ``NotInstalled`` in one line.

This module imports nothing that loads a model.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.apps import apps
from django.core import checks

from ..exceptions import NotInstalled
from .compat import BaseTaskBackend, Task

APP = "django_sqlqueue"
#: Check id: ``TASKS`` names the backend, the app is not installed.
APP_NOT_INSTALLED = "sqlqueue.tasks.E003"


def app_missing() -> bool:
    """Whether the app registry is ready and ``django_sqlqueue`` is not installed."""
    return apps.ready and not apps.is_installed(APP)


def app_missing_error(alias: str) -> checks.Error:
    """The check error of backend ``alias`` when the app is not installed."""
    return checks.Error(
        f"TASKS[{alias!r}] uses django_sqlqueue.tasks.SQLQueueBackend, but {APP!r} is not in INSTALLED_APPS.",
        hint=f"Add {APP!r} to INSTALLED_APPS and run manage.py migrate: tasks are messages in its tables.",
        id=APP_NOT_INSTALLED,
    )


class AppMissingBackend(BaseTaskBackend):
    """``SQLQueueBackend`` while ``django_sqlqueue`` is not installed; see the module docstring."""

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return [*super().check(**kwargs), app_missing_error(self.alias)]

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> NoReturn:
        raise NotInstalled(
            f"TASKS[{self.alias!r}] uses django_sqlqueue.tasks.SQLQueueBackend, but {APP!r} is not in "
            f"INSTALLED_APPS: add it there (then run `manage.py migrate {APP}`) to enqueue tasks."
        )
