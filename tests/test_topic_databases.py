"""Issue 32: topics routed to database aliases (SQLQUEUE["TOPIC_DATABASES"]) on the write path.

The test settings route ``second.*`` to the alias ``second``, a database of its own with the
queue's tables (tests/support/settings.py). A publish goes to the topic's database and joins
*that* database's transaction: the outbox is per database. The testing helpers drain each
consumer in its topic's database; a schedule publishing to a routed topic fires there; the
tasks backend refuses queues whose topics are routed away from its results.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_sqlqueue import publish, publish_many
from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import ConsumerSpec, registry
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.exceptions import ConfigurationError, OutboxWarning
from django_sqlqueue.models import ConsumerOffset, Message
from django_sqlqueue.schedules import parse_schedule
from django_sqlqueue.task_models import ScheduleState
from django_sqlqueue.testing import drain
from django_sqlqueue.worker.threads.scheduler import Scheduler

# transaction=True: real commits and rollbacks on each database (not savepoints of a test transaction).
pytestmark = [
    pytest.mark.django_db(databases=["default", "second"], transaction=True),
    pytest.mark.usefixtures("second_routes"),
]

ROUTED = "second.orders"
PLAIN = "first.orders"


class Boom(Exception):
    pass


def topics_in(alias: str) -> list[str]:
    return sorted(Message.objects.using(alias).values_list("topic", flat=True))


def test_publish_writes_a_routed_topic_to_its_database_only() -> None:
    assert get_settings().database_for(ROUTED) == "second"
    message = publish(ROUTED, {"n": 1}, key="k")
    publish_many(ROUTED, [{"payload": {"n": 2}}, {"payload": {"n": 3}}])
    publish(PLAIN, {"n": 4})
    assert message.created
    assert topics_in("second") == [ROUTED] * 3
    assert topics_in("default") == [PLAIN]


def test_rolling_back_the_routed_databases_transaction_removes_the_message() -> None:
    with pytest.raises(Boom), transaction.atomic(using="second"):
        publish(ROUTED, 1)
        publish_many(ROUTED, [{"payload": 2}])
        assert len(topics_in("second")) == 2  # visible inside the transaction
        raise Boom
    assert topics_in("second") == []


def test_the_outbox_is_per_database() -> None:
    """Committing default's transaction does not publish a second.* message written in
    second's rolled-back transaction; and the other way round."""
    with transaction.atomic(using="default"):
        with pytest.raises(Boom), transaction.atomic(using="second"):
            publish(ROUTED, "rolled back with second")
            raise Boom
        publish(PLAIN, "committed with default")
    assert (topics_in("default"), topics_in("second")) == ([PLAIN], [])

    with pytest.raises(Boom), transaction.atomic(using="default"):
        with transaction.atomic(using="second"):
            publish(ROUTED, "committed with second")
        publish(PLAIN, "rolled back with default")
        raise Boom
    assert (topics_in("default"), topics_in("second")) == ([PLAIN], [ROUTED])


def test_a_routed_publish_outside_its_databases_transaction_warns() -> None:
    """Only default's atomic() is open: the routed message cannot join it (OutboxWarning)."""
    with transaction.atomic(using="default"):
        with pytest.warns(
            OutboxWarning, match=r"writes to database 'second' \(the topic's: .*Open the atomic\(\) block on 'second'"
        ):
            publish(ROUTED, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with transaction.atomic(using="second"):
            publish(ROUTED, 2)  # joins second's transaction: no warning


def test_an_explicit_using_must_name_the_topics_database() -> None:
    assert publish(ROUTED, 1, using="second").created  # the same alias: fine
    assert publish(PLAIN, 1, using="default").created
    refusals = [
        (lambda: publish(ROUTED, 2, using="default"), "'second.orders' with using='default'.*database 'second'"),
        (lambda: publish(PLAIN, 2, using="second"), "'first.orders' with using='second'.*database 'default'"),
        (lambda: publish_many(PLAIN, [{"payload": 2}], using="second"), "TOPIC_DATABASES'\\] = \\{'first.orders'"),
    ]
    for call, match in refusals:
        with pytest.raises(ConfigurationError, match=match) as raised:
            call()
        assert "\n" not in str(raised.value)
    assert (topics_in("default"), topics_in("second")) == ([PLAIN], [ROUTED])  # nothing else written


def test_sequence_numbers_a_routed_topic_in_its_database() -> None:
    publish_many(ROUTED, [{"payload": n, "key": "k"} for n in range(3)])
    heads = sequence(ROUTED)
    assert list(heads.values()) == [3]
    assert sorted(Message.objects.using("second").values_list("offset", flat=True)) == [1, 2, 3]


@pytest.fixture
def handled() -> Iterator[list[tuple[str, Any]]]:
    """One consumer of a routed topic and one of a topic in the default database; the
    routed one's handler publishes to the default database's topic (drives the drain on)."""
    seen: list[tuple[str, Any]] = []

    def routed(message: Any) -> None:
        seen.append((message.topic, message.payload))
        publish(PLAIN, {"from": message.payload})

    specs = [
        ConsumerSpec(topic=ROUTED, group="g", handler=routed),
        ConsumerSpec(topic=PLAIN, group="g", handler=lambda m: seen.append((m.topic, m.payload))),
    ]
    for spec in specs:
        registry.register(spec)
    yield seen
    for spec in specs:
        registry.unregister(spec.group, spec.topic)


def test_drain_consumes_each_topic_in_its_database(handled: list[tuple[str, Any]]) -> None:
    publish_many(ROUTED, [{"payload": n, "key": "k"} for n in range(3)])
    summary = drain(group="g")
    assert handled[:3] == [(ROUTED, 0), (ROUTED, 1), (ROUTED, 2)]
    assert sorted(payload["from"] for topic, payload in handled[3:] if topic == PLAIN) == [0, 1, 2]  # the handler's
    assert (summary[f"g:{ROUTED}"].handled, summary[f"g:{PLAIN}"].handled) == (3, 3)
    # The group's watermark of the routed topic is in the routed database, and only there.
    marks = ConsumerOffset.objects.using("second").filter(consumer_group="g", topic=ROUTED)
    assert sum(marks.values_list("offset_acked", flat=True)) == 3
    assert not ConsumerOffset.objects.using("default").filter(topic=ROUTED).exists()


def test_drain_with_max_messages_stops_across_databases(handled: list[tuple[str, Any]]) -> None:
    publish_many(ROUTED, [{"payload": n, "key": "k"} for n in range(3)])
    summary = drain(group="g", max_messages=2)
    assert summary.stopped_early and summary.handled == 2


def test_a_schedule_publishing_to_a_routed_topic_fires_in_its_database() -> None:
    """The tick's state row lives in SQLQUEUE["DATABASE"], the message in the topic's database."""
    schedule = parse_schedule("routed", {"cron": "* * * * * *", "topic": ROUTED, "payload": {"p": 1}})
    scheduler = Scheduler([schedule], using="default")
    assert scheduler.run_once() == {"routed": 0}  # first seen: fires ticks after now
    ScheduleState.objects.filter(name="routed").update(
        created_at=scheduler.store.now() - dt.timedelta(seconds=2, milliseconds=500)
    )
    scheduler._next.clear()
    fired = scheduler.run_once()["routed"]
    assert fired in (2, 3)
    assert (topics_in("second"), topics_in("default")) == ([ROUTED] * fired, [])


def test_the_tasks_backend_refuses_queues_routed_away_from_its_results() -> None:
    from django_sqlqueue.tasks.backend import SQLQueueBackend
    from django_sqlqueue.tasks.options import TaskBackendMisconfigured

    routes = {"tasks.*": "second"}
    with override_settings(SQLQUEUE={**get_settings_raw(), "TOPIC_DATABASES": routes}):
        backend = SQLQueueBackend("default", {"QUEUES": ["default", "mail"], "OPTIONS": {}})
        errors = backend.check()
        assert [e.id for e in errors] == ["sqlqueue.tasks.E002"], errors
        assert "topic 'tasks.default' of task queue 'default' is routed to database 'second'" in errors[0].msg
        with pytest.raises(TaskBackendMisconfigured, match="must live with its result"):
            backend.topics()
    with override_settings(SQLQUEUE={**get_settings_raw(), "TOPIC_DATABASES": {"tasks.mail2": "second"}}):
        assert SQLQueueBackend("default", {"QUEUES": ["default", "mail"], "OPTIONS": {}}).check() == []


def get_settings_raw() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.SQLQUEUE)
