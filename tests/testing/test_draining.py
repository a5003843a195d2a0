"""testing/draining.py: choosing the consumers to drain, and draining a list of them.

tests/testing/test_testing.py drains through ``drain()`` (retries, dead letters, max_messages ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_sqlqueue import publish_many
from django_sqlqueue.consumers import ConsumerSpec, registry
from django_sqlqueue.exceptions import TestingError
from django_sqlqueue.models import Message
from django_sqlqueue.testing.draining import DrainSummary, drain_consumers, select_consumers

TOPIC = "testing.draining"


@pytest.fixture
def handled() -> Iterator[list[tuple[str, Any]]]:
    """Two registered consumers of TOPIC (groups a and b); what each handled, in order."""
    seen: list[tuple[str, Any]] = []
    specs = [
        ConsumerSpec(topic=TOPIC, group=group, handler=lambda m, g=group: seen.append((g, m.payload["n"])))
        for group in ("a", "b")
    ]
    for spec in specs:
        registry.register(spec)
    yield seen
    for spec in specs:
        registry.unregister(spec.group, spec.topic)


def test_consumers_are_chosen_by_topic_and_group(handled: list[tuple[str, Any]]) -> None:
    assert sorted(s.name for s in select_consumers(TOPIC)) == [f"a:{TOPIC}", f"b:{TOPIC}"]
    assert [s.name for s in select_consumers(group="b", topic=TOPIC)] == [f"b:{TOPIC}"]
    assert f"a:{TOPIC}" in [s.name for s in select_consumers()]
    with pytest.raises(
        TestingError, match=rf"no registered consumer of topic 'nope' and group 'a' \(registered: .*a:{TOPIC}"
    ):
        select_consumers("nope", group="a")


@pytest.mark.django_db
def test_drain_consumers_runs_only_the_consumers_given(handled: list[tuple[str, Any]]) -> None:
    publish_many(TOPIC, [{"payload": {"n": i}, "key": "k"} for i in range(3)])
    summary = drain_consumers(select_consumers(TOPIC, group="b"))
    assert handled == [("b", 0), ("b", 1), ("b", 2)]  # one key: in order; group a never ran
    assert (summary.handled, summary[f"b:{TOPIC}"].attempts, summary[f"a:{TOPIC}"].attempts) == (3, 3, 0)
    assert str(summary).splitlines()[1:] == [f"  b:{TOPIC}: handled=3 retried=0 dead_lettered=0"]
    assert Message.objects.filter(topic=TOPIC).count() == 3  # acked, not deleted (GC does that)


@pytest.mark.django_db
def test_drain_consumers_refuses_a_bad_max_messages_and_zero_delivers_nothing(
    handled: list[tuple[str, Any]],
) -> None:
    publish_many(TOPIC, [{"payload": {"n": 0}}])
    for bad in (-1, 1.5, "2"):
        with pytest.raises(TestingError, match="max_messages must be a non-negative integer"):
            drain_consumers(select_consumers(TOPIC), max_messages=bad)  # type: ignore[arg-type]
    assert drain_consumers(select_consumers(TOPIC), max_messages=0) == DrainSummary(duration=0.0)
    assert handled == []
