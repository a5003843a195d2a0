"""testing/capture.py: what a capture records -- nested captures, publishes pending before it
opened, the list frozen once it closes -- and how ``payload=`` matches.

tests/testing/test_testing.py covers the assertions' messages and the commit-aware cases.
The last test runs a small suite in a pytest subprocess: what one test leaves to the next.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_sqlqueue import publish
from django_sqlqueue.exceptions import TestingError
from django_sqlqueue.testing import capture
from django_sqlqueue.testing.capture import capture_published, current_capture, payload_matches

from .inner_pytest import run_inner_pytest

TOPIC = "testing.capture"


def test_a_dict_matches_as_a_nested_subset_a_callable_as_a_predicate_the_rest_by_equality() -> None:
    actual = {"order": 1, "lines": [{"sku": "a"}], "customer": {"name": "alice", "vip": False}}
    assert payload_matches(actual, {"customer": {"name": "alice"}})
    assert payload_matches(actual, {})
    assert not payload_matches(actual, {"customer": {"name": "bob"}})
    assert not payload_matches(actual, {"missing": None})
    assert not payload_matches([actual], {"order": 1})  # a dict matches dicts only
    assert payload_matches(actual, {"lines": [{"sku": "a"}]})
    assert not payload_matches(actual, {"lines": [{}]})  # lists are compared whole
    assert payload_matches(actual, lambda p: p["order"] == 1) and not payload_matches(actual, lambda p: False)
    assert payload_matches(actual["lines"], [{"sku": "a"}]) and not payload_matches(7, "7")


@pytest.mark.django_db
def test_captures_nest_and_each_records_what_was_published_while_it_was_open() -> None:
    with pytest.raises(TestingError, match="needs an open capture"):
        current_capture()
    publish(TOPIC, {"n": 0})  # pending in the test's transaction before any capture opened
    with capture_published() as outer:
        publish(TOPIC, {"n": 1})
        with capture_published() as inner:
            assert current_capture() is inner
            publish(TOPIC, {"n": 2})
        assert current_capture() is outer
        publish(TOPIC, {"n": 3})
    assert [m.payload["n"] for m in outer] == [1, 2, 3]
    assert [m.payload["n"] for m in inner] == [2]
    assert not capture._open  # closed: no module-level assertion looks at them again
    publish(TOPIC, {"n": 4})
    assert len(outer) == 3 and len(inner) == 1  # closed: frozen


# A user's suite: a test that publishes (each way of capturing), then one that publishes
# nothing and asserts at module level. Before issue 29 the second passed, on the capture the
# first had closed; run alone it failed.
SUITE = """
import pytest
from django.test import TestCase

from django_sqlqueue import publish
from django_sqlqueue.testing import SQLQueueTestMixin, assert_not_published, assert_published, capture_published
from django_sqlqueue.testing.tasks import assert_enqueued
from tests.support.task_helpers import task_settings
from tests.support.taskapp import tasks

TOPIC = "testing.scope"


@pytest.mark.django_db
def test_function_publishes():
    with capture_published():
        publish(TOPIC, {"n": 1})
        assert_published(TOPIC, count=1)


@pytest.mark.django_db
def test_silent_after_function():
    assert_published(TOPIC)


class PublishingTests(SQLQueueTestMixin, TestCase):
    def test_mixin_publishes(self):
        publish(TOPIC, {"n": 2})
        assert_published(TOPIC, count=1)  # module level: this test's capture


@pytest.mark.django_db
def test_silent_after_mixin():
    assert_published(TOPIC)


@pytest.mark.django_db
def test_fixture_publishes(sqlqueue_published):
    publish(TOPIC, {"n": 3})
    assert_published(TOPIC, count=1)  # module level: the fixture's capture


@pytest.mark.django_db
def test_silent_after_fixture():
    assert_published(TOPIC)


@pytest.mark.django_db
def test_task_enqueued():
    with task_settings(), capture_published():
        tasks.add.enqueue(2, 3)
        assert_enqueued(tasks.add, args=[2, 3], count=1)


@pytest.mark.django_db
def test_silent_after_task():
    assert_enqueued(tasks.add)


@pytest.mark.django_db
def test_silent_not_published():
    assert_not_published()


class SilentTests(SQLQueueTestMixin, TestCase):
    def test_silent_in_mixin(self):
        assert_published(TOPIC)


@pytest.mark.django_db
def test_silent_with_fixture(sqlqueue_published):
    assert_published(TOPIC)
"""


# transaction=True: the test database is set up, and this test holds no transaction that
# would lock the inner session out of it (SQLite's BEGIN IMMEDIATE).
@pytest.mark.django_db(transaction=True)
def test_a_test_that_publishes_nothing_fails_after_a_test_that_published(tmp_path: Any) -> None:
    from django.db import connection

    run = run_inner_pytest(tmp_path, SUITE, database=connection.settings_dict["NAME"])
    no_capture = "django_sqlqueue.exceptions.TestingError: {}() needs an open capture"
    nothing = "AssertionError: expected at least one message on 'testing.scope', found 0.\nNothing was published"
    expected = {
        "test_function_publishes": "passed",
        "test_silent_after_function": no_capture.format("assert_published"),
        "test_mixin_publishes": "passed",
        "test_silent_after_mixin": no_capture.format("assert_published"),
        "test_fixture_publishes": "passed",
        "test_silent_after_fixture": no_capture.format("assert_published"),
        "test_task_enqueued": "passed",
        "test_silent_after_task": no_capture.format("assert_enqueued"),
        "test_silent_not_published": no_capture.format("assert_not_published"),
        # With the mixin's or the fixture's capture: the test's own, empty.
        "test_silent_in_mixin": nothing,
        "test_silent_with_fixture": nothing,
    }
    got = {
        name: next((e for e in expected.values() if outcome.startswith(e)), outcome)
        for name, outcome in run.outcomes.items()
    }
    assert got.keys() == expected.keys(), run.output[-3000:]
    assert got == expected
    # The error says how to open a capture.
    message = run.outcomes["test_silent_after_function"]
    assert "capture_published()" in message and "sqlqueue_published" in message and "SQLQueueTestMixin" in message
