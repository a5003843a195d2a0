"""tasks/app_missing.py: the backend while ``django_sqlqueue`` is not installed.

The whole path (a ``manage.py check`` without the app) is in test_checks.py; here the
stand-in itself: a check error, tasks still declarable, an enqueue refused in one line.
"""

from __future__ import annotations

import pytest

from django_sqlqueue.exceptions import NotInstalled
from django_sqlqueue.tasks import SQLQueueBackend
from django_sqlqueue.tasks.app_missing import APP_NOT_INSTALLED, AppMissingBackend, app_missing
from tests.support.taskapp import tasks


def test_the_stand_in_reports_the_missing_app_and_refuses_to_enqueue() -> None:
    backend = AppMissingBackend("default", {"QUEUES": ["default"]})
    [error] = backend.check()
    assert error.id == APP_NOT_INSTALLED
    assert "'django_sqlqueue' is not in INSTALLED_APPS" in error.msg
    backend.validate_task(tasks.add)  # declaring a task (an import) does not raise
    with pytest.raises(NotInstalled, match=r"add it there .* to enqueue tasks") as raised:
        backend.enqueue(tasks.add, [1, 2], {})
    assert "\n" not in str(raised.value)


def test_with_the_app_installed_the_package_hands_out_the_real_backend() -> None:
    assert not app_missing()
    assert SQLQueueBackend.__module__ == "django_sqlqueue.tasks.backend"
