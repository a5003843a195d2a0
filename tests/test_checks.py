"""System checks of the queue database: sqlqueue.E010, W001 and W002 (SQLite transaction mode)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def check_messages() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(tags=["sqlqueue"]) if m.id and m.id.startswith("sqlqueue.")]


def with_queue_database(settings: Any, queue: dict[str, Any]) -> override_settings:
    """The project's databases plus a ``queue`` alias, which SQLQUEUE["DATABASE"] names."""
    return override_settings(DATABASES={**settings.DATABASES, "queue": queue}, SQLQUEUE={"DATABASE": "queue"})


def sqlite(tmp_path: Any, **options: Any) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "queue.sqlite3"), "OPTIONS": options}


@pytest.mark.parametrize("options", [{}, {"transaction_mode": "DEFERRED"}, {"timeout": 20}])
def test_sqlite_queue_database_without_immediate_transactions_warns(settings, tmp_path, options):
    with with_queue_database(settings, sqlite(tmp_path, **options)):
        messages = check_messages()
    (warning,) = [m for m in messages if m.id == "sqlqueue.W002"]
    assert warning.level == checks.WARNING
    assert "'queue'" in warning.msg and "IMMEDIATE" in warning.msg
    assert "transaction_mode" in warning.hint and "IMMEDIATE" in warning.hint


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate", "EXCLUSIVE"])
def test_sqlite_queue_database_with_write_lock_at_begin_passes(settings, tmp_path, mode):
    with with_queue_database(settings, sqlite(tmp_path, transaction_mode=mode)):
        assert check_messages() == []


def test_only_the_queue_database_is_checked(settings, tmp_path):
    # A deferred SQLite database the queue does not use is none of its business.
    databases = {**settings.DATABASES, "other": sqlite(tmp_path)}
    with override_settings(DATABASES=databases, SQLQUEUE={}):
        assert "sqlqueue.W002" not in [m.id for m in check_messages()]
    with override_settings(DATABASES=databases, SQLQUEUE={"DATABASE": "other"}):
        assert "sqlqueue.W002" in [m.id for m in check_messages()]


def test_sqlite_warning_fails_manage_py_check_at_warning_level(settings, tmp_path):
    with with_queue_database(settings, sqlite(tmp_path)), pytest.raises(SystemCheckError, match=r"sqlqueue\.W002"):
        call_command("check", "--fail-level", "WARNING", tags=["sqlqueue"])


def test_unsupported_queue_database_is_an_error(settings):
    with with_queue_database(settings, {"ENGINE": "django.db.backends.dummy"}):
        assert "sqlqueue.E010" in [m.id for m in check_messages()]


def test_the_suite_database_passes_the_checks():
    # Whatever DATABASE_URL the suite runs on, tests/support/settings.py configures it as the README says.
    assert check_messages() == []


def test_the_settings_check_reports_each_problem_of_sqlqueue_as_an_error():
    """checks.check_settings: every problem ``conf.validate`` finds, as an Error with its id and hint."""
    from django_sqlqueue.checks import check_settings
    from django_sqlqueue.conf import validate

    raw = {"BATCH_SIZE": 0, "BOGUS": 1}
    with override_settings(SQLQUEUE=raw):
        errors = check_settings()
    assert errors and all(isinstance(e, checks.Error) for e in errors)
    assert [(e.id, e.msg, e.hint) for e in errors] == [(p.id, p.msg, p.hint or None) for p in validate(raw)]
    assert any("BOGUS" in e.msg for e in errors) and any("BATCH_SIZE" in e.msg for e in errors)
    with override_settings(SQLQUEUE={"BATCH_SIZE": 10}):
        assert check_settings() == []
