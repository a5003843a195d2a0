"""tasks/checks.py and ``SQLQueueBackend.check()``: mistakes in TASKS are ``manage.py check`` errors.

Issue 29: a typo in ``TASKS[...]["OPTIONS"]`` passed ``check`` and surfaced later as a long
import traceback; ``TASKS`` naming this backend without the app installed was not flagged.
The command line is a real ``manage.py check`` subprocess (tests/tasks/check_settings.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from django_sqlqueue.tasks import checks
from django_sqlqueue.tasks.compat import task_backends

ROOT = Path(__file__).resolve().parents[2]


def _forget_backends() -> None:
    from asgiref.local import Local

    task_backends.__dict__.pop("settings", None)
    task_backends._connections = Local(task_backends.thread_critical)


@pytest.fixture
def typo() -> Iterator[None]:
    params = {"BACKEND": checks.BACKEND_PATH, "QUEUES": ["default"], "OPTIONS": {"MAX_ATEMPTS": 3, "GROPU": "x"}}
    with override_settings(TASKS={"default": params}):
        _forget_backends()
        yield
    _forget_backends()


def manage_check(scenario: str) -> subprocess.CompletedProcess[str]:
    # The subprocess uses this session's test database: `check` may connect (Django 6 asks a
    # MySQL server about JSON support), and the database DATABASE_URL names need not exist.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.tasks.check_settings",
        "SQLQUEUE_TSK_SCENARIO": scenario,
        "SQLQUEUE_TSK_DATABASE": connection.settings_dict["NAME"],
    }
    argv = [sys.executable, "manage.py", "check"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


# Every check runs, the models' too: on SQLite a JSONField's check asks the connection whether
# it supports JSON (the first time in a process), on every alias; no transaction is held, so
# that the "other" alias (a mirror of the default) can read on SQLite too.
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_check_names_each_unknown_option_with_the_nearest_valid_one(typo: None) -> None:
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    text = str(raised.value)
    assert "(sqlqueue.tasks.E001) TASKS['default']['OPTIONS'] has an unknown key 'MAX_ATEMPTS'." in text
    assert "HINT: Did you mean 'MAX_ATTEMPTS'? Valid keys: ATOMIC, BATCH_SIZE, GROUP," in text
    assert "has an unknown key 'GROPU'." in text and "Did you mean 'GROUP'?" in text


def test_the_backends_are_checked_whether_or_not_the_tasks_framework_checks_them(typo: None) -> None:
    """Django 5.2 without ``django_tasks`` in INSTALLED_APPS: the backport's check is not
    registered, so this module's runs the backends' checks (else it leaves them to it)."""
    found = checks.check_task_backends()
    if checks.BUILTIN or "django_tasks" in __import__("django.conf").conf.settings.INSTALLED_APPS:
        assert found == []
    else:
        assert [m.id for m in found] == ["sqlqueue.tasks.E001", "sqlqueue.tasks.E001"]


@pytest.mark.django_db(transaction=True)
def test_manage_py_check_reports_an_options_typo_without_a_traceback() -> None:
    done = manage_check("typo")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "(sqlqueue.tasks.E001) TASKS['default']['OPTIONS'] has an unknown key 'MAX_ATEMPTS'." in done.stderr
    assert "Did you mean 'MAX_ATTEMPTS'?" in done.stderr


@pytest.mark.django_db(transaction=True)
def test_manage_py_check_reports_the_backend_without_the_app() -> None:
    done = manage_check("no-app")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        "(sqlqueue.tasks.E003) TASKS['default'] uses django_sqlqueue.tasks.SQLQueueBackend, "
        "but 'django_sqlqueue' is not in INSTALLED_APPS."
    ) in done.stderr


def test_a_well_configured_backend_has_no_check_message() -> None:
    assert task_backends["default"].check() == []
    assert checks.configured_aliases() == ["default"]
