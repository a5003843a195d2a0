"""System checks: the queue database (sqlqueue.E010, W001, W002 -- SQLite transaction mode), a
consumed topic no message reaches (W003, a database check) and the app missing from
INSTALLED_APPS (E015). Each id is documented in docs/checks.md."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from django_sqlqueue import publish
from django_sqlqueue.checks import check_consumer_topics, unreached_topics
from django_sqlqueue.consumers import ConsumerSpec, check_installed, registry
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import Message

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


# -- sqlqueue.W003: a consumed topic that no message reaches -------------------------------


def handle(message: Any) -> None:
    pass


@pytest.fixture
def consuming() -> Iterator[Any]:
    """Register ``(group, topic)`` consumers in the global registry for the test."""
    added: list[tuple[str, str]] = []

    def add(group: str, topic: str) -> None:
        registry.register(ConsumerSpec(topic, group, handle))
        added.append((group, topic))

    yield add
    for group, topic in added:
        registry.unregister(group, topic)


def w003(databases: list[str] | None = ["default"], topic: str = "") -> list[checks.CheckMessage]:  # noqa: B006
    """The W003 warnings of ``check --database default`` (``databases``), about ``topic`` if given
    (else all of them)."""
    messages = checks.run_checks(tags=[checks.Tags.database], databases=databases)
    return [m for m in messages if m.id == "sqlqueue.W003" and (not topic or f"topic {topic!r}" in m.msg)]


@pytest.mark.django_db
def test_a_consumed_topic_no_message_reached_is_a_warning_naming_the_nearest_topics(consuming):
    """Issue 29: ``order.created`` for ``orders.created`` passed ``check``; the worker leased 8
    partitions of a topic that never gets a message."""
    publish("chk.orders.created", {"n": 1})
    consuming("billing", "chk.order.created")
    consuming("billing", "chk.orders.created")
    (warning,) = w003(topic="chk.order.created")
    assert warning.level == checks.WARNING
    assert "consumed by billing" in warning.msg and "nearest known topics: chk.orders.created" in warning.msg
    assert "SQLQUEUE['TOPICS']" in warning.hint and "{'chk.order.created': {}}" in warning.hint
    assert w003(topic="chk.orders.created") == []  # a message reached it


@pytest.mark.django_db
def test_a_topic_declared_or_published_by_the_package_is_not_suspect(consuming):
    consuming("g", "chk.declared")
    consuming("g", "chk.pinged")
    consuming("g", "chk.lonely_dlq")  # a dead-letter topic: the engine writes it
    schedules = {"ping": {"cron": "*/5 * * * *", "topic": "chk.pinged", "payload": {}}}
    with override_settings(
        SQLQUEUE={**django_settings.SQLQUEUE, "TOPICS": {"chk.declared": {}}, "SCHEDULES": schedules}
    ):
        assert w003(topic="chk.declared") == w003(topic="chk.pinged") == w003(topic="chk.lonely_dlq") == []
    assert w003(topic="chk.declared") == w003(topic="chk.pinged") == []  # no near namesake: not a typo
    publish("chk.declares", {"n": 1})
    publish("chk.pinger", {"n": 1})
    assert w003(topic="chk.declared") and w003(topic="chk.pinged")  # declared nowhere now, and near misses


@pytest.mark.django_db
def test_a_topic_whose_messages_were_handled_and_collected_is_not_suspect(consuming):
    # RETENTION 0: the log loses a handled message within a minute; the partition's head keeps
    # the proof that messages reached the topic.
    consuming("g", "chk.collected")
    publish("chk.collects", {"n": 1})  # a near namesake with messages: chk.collected looks like a typo
    assert w003(topic="chk.collected")
    publish("chk.collected", {"n": 1})
    sequence("chk.collected")
    Message.objects.filter(topic="chk.collected").delete()
    assert w003(topic="chk.collected") == []


@pytest.mark.django_db
def test_a_new_topic_without_a_near_namesake_is_not_suspect(consuming):
    """A consumer of a topic nothing has published to yet is normal (a fresh database, a new
    feature): only a near miss of a known topic is reported, so a fresh install is quiet."""
    consuming("billing", "chk.invoices.paid")
    consuming("billing", "chk.invoices.sent")  # a sibling (ratio 0.76), not a typo
    consuming("mail", "chk.signups")
    assert w003() == []
    consuming("audit", "chk.invoice.paid")  # one letter from a consumed topic: one is a typo
    assert {m.msg.split("'")[1] for m in w003()} == {"chk.invoice.paid", "chk.invoices.paid"}


# `check` runs every check, the models' too, which on Django 6.1 may connect to every alias
# (JSONField asks each about JSON support): no transaction is held, so SQLite's "other"
# alias (a mirror of the default) can connect too.
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_the_topic_check_reads_the_database_only_when_asked_to(consuming, django_assert_num_queries):
    consuming("g", "chk.order.created")
    consuming("g", "chk.orders.created")
    with django_assert_num_queries(0):
        assert check_consumer_topics(databases=None) == []  # called without the queue's alias: no query
    assert w003(databases=["other"]) == []  # not the queue's alias
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "sqlqueue.W003" not in out.getvalue()
    call_command("check", "--database", "default", stdout=out, stderr=out)
    assert "sqlqueue.W003" in out.getvalue() and "chk.order.created" in out.getvalue()


@pytest.mark.django_db
def test_the_topic_check_skips_an_unmigrated_queue_database_quietly(settings, tmp_path: Path, consuming):
    consuming("g", "chk.order.created")
    fresh = sqlite(tmp_path, transaction_mode="IMMEDIATE")  # a new file: no table at all
    wrapper = load_backend(fresh["ENGINE"]).DatabaseWrapper
    connections["queue"] = wrapper({**connections["default"].settings_dict, **fresh, "PORT": ""}, "queue")
    try:
        with with_queue_database(settings, fresh):
            assert check_consumer_topics(databases=["queue"]) == []
            assert check_consumer_topics(databases=["default"]) == []  # not the queue's alias
    finally:
        connections["queue"].close()
        del connections["queue"]


@pytest.mark.django_db
def test_unreached_topics_asks_nothing_of_the_database_when_every_topic_is_declared(django_assert_num_queries):
    from django_sqlqueue.conf import QueueSettings

    conf = QueueSettings(TOPICS={"chk.a": {}})
    with django_assert_num_queries(0):
        assert unreached_topics([("g", "chk.a"), ("g", "chk.a_dlq")], "default", conf) == []


# -- sqlqueue.E015: the package used without the app -------------------------------------


def test_the_package_used_without_the_app_installed_is_an_error():
    assert check_installed() == []
    apps_without = [app for app in django_settings.INSTALLED_APPS if app != "django_sqlqueue"]
    with override_settings(INSTALLED_APPS=apps_without):
        errors = [m for m in checks.run_checks(tags=["sqlqueue"]) if m.id == "sqlqueue.E015"]
    (error,) = errors
    assert error.level == checks.ERROR and "INSTALLED_APPS" in error.msg
    assert "Add 'django_sqlqueue' to INSTALLED_APPS" in error.hint and "migrate django_sqlqueue" in error.hint
