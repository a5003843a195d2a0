"""Settings of a small project for tests/tasks/test_checks.py's ``manage.py check`` subprocesses.

``SQLQUEUE_TSK_SCENARIO`` picks the mistake: ``typo`` (a misspelt ``OPTIONS`` key, the app
installed) or ``no-app`` (``TASKS`` names the backend, ``django_sqlqueue`` not installed).
"""

from __future__ import annotations

import importlib.util
import os

from testproject.settings import DATABASES

# The calling test's database (the suite's test database, which exists), not DATABASE_URL's.
DATABASES["default"]["NAME"] = os.environ.get("SQLQUEUE_TSK_DATABASE", DATABASES["default"]["NAME"])

SECRET_KEY = "tsk-checks"
USE_TZ = True
SCENARIO = os.environ.get("SQLQUEUE_TSK_SCENARIO", "typo")

INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
if SCENARIO == "typo":
    INSTALLED_APPS.append("django_sqlqueue")
elif importlib.util.find_spec("django.tasks") is None:
    # Django 5.2: the backport's app registers the tasks check that runs the backends' check().
    INSTALLED_APPS.append("django_tasks")
else:
    # Django 6 registers its tasks check when django.tasks is first imported: in a project, by
    # the first module that declares a @task (docs/tasks.md, "Mistakes check reports").
    import django.tasks  # noqa: F401

TASKS = {
    "default": {
        "BACKEND": "django_sqlqueue.tasks.SQLQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"MAX_ATEMPTS": 3} if SCENARIO == "typo" else {},
    }
}
