"""Django project of the django-sqlqueue tasks-backend peer (Django 5.2 + the django-tasks backport)."""

import copy
import os
import sys

from benchlib.django_base import COMMON, databases

SQLQUEUE_SRC = os.environ.get("SQLQUEUE_SRC") or os.getcwd()
if SQLQUEUE_SRC not in sys.path:
    sys.path.append(SQLQUEUE_SRC)

globals().update(copy.deepcopy(COMMON))

DATABASES = databases(os.environ.get("BENCH_DB", "bench_sqlqueuetasks"))
DATABASES["default"]["OPTIONS"]["isolation_level"] = "read committed"
INSTALLED_APPS = ["django_tasks", "django_sqlqueue", "benchtasks"]
USE_TZ = True

TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SQLQueueBackend", "QUEUES": ["default"]}}

_poll = float(os.environ.get("BENCH_POLL", "0.1"))
SQLQUEUE = {"POLL_INTERVAL": _poll, "POLL_INTERVAL_MAX": _poll}
