"""A task module whose import takes a while: two handler threads meet its first import
(tests/tasks/test_trust.py)."""

from __future__ import annotations

import time

time.sleep(0.5)  # the other thread finds the module in sys.modules, still initializing

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def imported_slowly() -> str:
    return "ok"
