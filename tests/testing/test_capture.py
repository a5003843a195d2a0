"""testing/capture.py: what a capture records -- nested captures, publishes pending before it
opened, the list frozen once it closes -- and how ``payload=`` matches.

tests/testing/test_testing.py covers the assertions' messages and the commit-aware cases.
"""

from __future__ import annotations

import pytest

from django_sqlqueue import publish
from django_sqlqueue.exceptions import TestingError
from django_sqlqueue.testing import capture
from django_sqlqueue.testing.capture import capture_published, current_capture, payload_matches

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
def test_captures_nest_and_each_records_what_was_published_while_it_was_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "_last", [])  # no capture closed yet in this test
    with pytest.raises(TestingError, match="needs a capture"):
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
    assert current_capture() is outer  # the one closed last
    publish(TOPIC, {"n": 4})
    assert len(outer) == 3 and len(inner) == 1  # closed: frozen
