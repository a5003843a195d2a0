"""django_sqlqueue.testing: capturing publishes, asserting on them, draining the consumers.

Real database everywhere: ``drain()`` runs the engine's own poll and batch path, inside
the test's transaction (``db``) and with commits (``transactional_db``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import TestCase

from django_sqlqueue import Reject, Retry, publish, publish_many, signals
from django_sqlqueue.consumers import ConsumerSpec, ReceivedMessage, registry
from django_sqlqueue.exceptions import TestingError
from django_sqlqueue.models import Message
from django_sqlqueue.testing import (
    SQLQueueTestMixin,
    assert_not_published,
    assert_published,
    capture_published,
    drain,
    process,
)
from django_sqlqueue.testing.tasks import assert_enqueued, assert_not_enqueued, drain_tasks
from tests.support.task_helpers import task_settings

TOPIC = "testing.orders"


@pytest.fixture
def register() -> Iterator[Callable[..., ConsumerSpec]]:
    """Register consumers for one test (unregistered after it)."""
    added: list[ConsumerSpec] = []

    def add(handler: Callable[[ReceivedMessage], Any], *, topic: str = TOPIC, group: str = "g", **options: Any):
        spec = ConsumerSpec(topic=topic, group=group, handler=handler, **options)
        registry.register(spec)
        added.append(spec)
        return spec

    yield add
    for spec in added:
        registry.unregister(spec.group, spec.topic)


def dead_letters(topic: str = TOPIC) -> list[Message]:
    return list(Message.objects.filter(topic=f"{topic}_dlq"))


# -- capture ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_capture_records_payload_key_and_id_inside_the_tests_transaction() -> None:
    with capture_published() as published:
        publish(TOPIC, {"order": 1, "lines": [{"sku": "a"}], "customer": {"name": "alice"}}, key="alice", id="o-1")
        publish_many(TOPIC, [{"payload": {"order": 2}, "key": 7}, {"payload": {"order": 3}}])
    assert [m.payload["order"] for m in published] == [1, 2, 3]
    first = published[0]
    assert (first.topic, first.key, first.id) == (TOPIC, "alice", "o-1")
    published.assert_published(TOPIC, key="alice", payload={"customer": {"name": "alice"}})
    published.assert_published(TOPIC, key=7, count=1)  # keys compare as strings
    published.assert_published(TOPIC, payload=lambda p: p["order"] > 1, count=2)
    published.assert_published(TOPIC, count=3)
    published.assert_not_published("testing.other")
    published.assert_not_published(TOPIC, key="bob")


@pytest.mark.django_db
def test_a_rolled_back_publish_is_not_captured() -> None:
    with capture_published() as published:
        publish(TOPIC, {"order": 1}, key="kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            publish(TOPIC, {"order": 2}, key="rolled-back")
            raise RuntimeError("payment declined")
    published.assert_published(TOPIC, key="kept", count=1)
    published.assert_not_published(TOPIC, key="rolled-back")
    assert len(published) == 1


@pytest.mark.django_db(transaction=True)
def test_committed_publishes_are_captured_and_rolled_back_ones_are_not() -> None:
    with capture_published() as published:
        publish(TOPIC, {"order": 1})  # autocommit: commits at once
        with transaction.atomic():
            publish(TOPIC, {"order": 2})
        with pytest.raises(RuntimeError), transaction.atomic():
            publish(TOPIC, {"order": 3})
            raise RuntimeError("rolled back")
        publish(TOPIC, {"order": 1}, id=published[0].id)  # a re-publish stores nothing
    assert [m.payload["order"] for m in published] == [1, 2]


@pytest.mark.django_db
def test_payloads_are_what_a_handler_gets() -> None:
    from decimal import Decimal

    with capture_published() as published:
        publish(TOPIC, {"total": Decimal("12.50")})
    published.assert_published(TOPIC, payload={"total": "12.50"})


@pytest.mark.django_db
def test_assertion_failures_list_what_was_published() -> None:
    with capture_published() as published:
        publish(TOPIC, {"order": 1}, key="alice")
    with pytest.raises(AssertionError) as failure:
        published.assert_published(TOPIC, key="bob", payload={"order": 1})
    text = str(failure.value)
    assert f"expected at least one message on {TOPIC!r} with key='bob'" in text
    assert "found 0" in text
    assert f"Published (1):\n  {TOPIC} key='alice'" in text and '"order": 1' in text

    with pytest.raises(AssertionError, match="expected 2 message"):
        published.assert_published(TOPIC, count=2)
    with pytest.raises(AssertionError, match="expected no message on any topic, found 1"):
        published.assert_not_published()


@pytest.mark.django_db
def test_module_level_assertions_use_the_innermost_open_capture_and_never_a_closed_one() -> None:
    with capture_published() as published:
        publish(TOPIC, {"order": 1})
        with capture_published():
            publish(TOPIC, {"order": 2})
            assert_published(TOPIC, payload={"order": 2}, count=1)
            assert_not_published(TOPIC, payload={"order": 1})
        assert_published(TOPIC, count=2)
    # After the block the capture is closed: it could as well belong to an earlier test.
    with pytest.raises(TestingError, match=r"assert_published\(\) needs an open capture.*SQLQueueTestMixin"):
        assert_published(TOPIC, count=2)
    with pytest.raises(TestingError, match=r"or call published.assert_not_published\(...\) after it"):
        assert_not_published(TOPIC)
    published.assert_published(TOPIC, count=2)  # the object the block yielded still works
    published.assert_not_published("testing.other")


def test_importing_the_helpers_changes_nothing() -> None:
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.support.settings'); django.setup(); "
        "from django_sqlqueue import signals; import django_sqlqueue.testing, django_sqlqueue.testing.tasks, "
        "django_sqlqueue.testing.pytest_plugin; "
        "assert not signals.message_published.receivers, signals.message_published.receivers"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert not signals.message_published.receivers  # and no capture left its receiver behind


# -- a view that publishes, and one that forgets to --------------------------------------


@pytest.mark.django_db
def test_assert_published_passes_for_a_view_that_publishes(client: Any, sqlqueue_published: Any) -> None:
    response = client.post("/orders/", {"customer": "alice", "total": "12.50"})
    assert response.status_code == 201
    (message,) = sqlqueue_published.assert_published(
        "orders.created", key="alice", payload={"customer": "alice", "total": "12.50"}, count=1
    )
    assert message.payload["order_id"] == response.json()["order_id"]


@pytest.mark.django_db
def test_assert_published_fails_when_a_view_forgets_to_publish(client: Any, sqlqueue_published: Any) -> None:
    # The view publishes, then its transaction rolls back: as good as forgetting to publish.
    client.post("/orders/", {"customer": "alice", "total": "1"})
    response = client.post("/orders/failing/", {"customer": "bob", "total": "12.50"})
    assert response.status_code == 402
    with pytest.raises(AssertionError) as failure:
        sqlqueue_published.assert_published("orders.created", key="bob")
    assert "expected at least one message on 'orders.created' with key='bob', found 0" in str(failure.value)
    assert "orders.created key='alice'" in str(failure.value)  # what was published instead


# -- drain -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_drain_runs_every_consumer_and_reports_per_consumer(register: Any) -> None:
    seen: dict[str, list[int]] = {"billing": [], "analytics": []}
    register(lambda m: seen["billing"].append(m.payload["n"]), group="billing", batch_size=3)
    register(lambda m: seen["analytics"].append(m.payload["n"]), group="analytics")
    publish_many(TOPIC, [{"payload": {"n": n}, "key": "k"} for n in range(10)])

    summary = drain(TOPIC)
    assert seen == {"billing": list(range(10)), "analytics": list(range(10))}  # in order per key
    assert summary.handled == 20 and summary.retried == 0 and summary.dead_lettered == 0
    assert summary[f"billing:{TOPIC}"].handled == 10
    assert summary[f"analytics:{TOPIC}"].handled == 10
    assert f"billing:{TOPIC}: handled=10" in str(summary)
    assert drain(TOPIC).handled == 0  # acked: nothing left


@pytest.mark.django_db
def test_drain_chooses_consumers_by_group(register: Any) -> None:
    register(lambda m: None, group="billing")
    register(lambda m: None, group="analytics")
    publish(TOPIC, {"n": 1})
    assert drain(TOPIC, group="billing").consumers.keys() == {f"billing:{TOPIC}"}
    assert drain(group="analytics")[f"analytics:{TOPIC}"].handled == 1
    with pytest.raises(TestingError, match="no registered consumer of topic 'nope'"):
        drain("nope")


@pytest.mark.django_db
def test_drain_dead_letters_a_poison_message(register: Any) -> None:
    attempts: list[int] = []

    def charge(message: ReceivedMessage) -> None:
        attempts.append(message.attempt)
        if message.payload["card"] == "stolen":
            raise ValueError("card declined")

    register(charge, group="billing", max_attempts=3)
    publish(TOPIC, {"card": "stolen"}, key="mallory", id="poison")
    publish(TOPIC, {"card": "ok"}, key="alice")

    summary = drain(TOPIC)
    assert summary.handled == 1 and summary.retried == 2 and summary.dead_lettered == 1
    (dead,) = dead_letters()
    assert dead.payload == {"card": "stolen"} and dead.failure_count == 3
    assert "ValueError: card declined" in dead.last_error
    assert sorted(attempts) == [1, 1, 2, 3]


@pytest.mark.django_db
def test_drain_dead_letters_a_rejected_message_at_once(register: Any) -> None:
    def handler(message: ReceivedMessage) -> None:
        raise Reject("malformed")

    register(handler)
    publish(TOPIC, {"n": 1})
    summary = drain()
    assert (summary.retried, summary.dead_lettered) == (0, 1)
    assert len(dead_letters()) == 1


@pytest.mark.django_db
def test_drain_collapses_retry_delays(register: Any) -> None:
    def handler(message: ReceivedMessage) -> None:
        if message.attempt == 1:
            raise Retry("later", delay=3600)
        if message.attempt == 2:
            raise RuntimeError("flaky")  # the backoff's delay (BACKOFF_MIN 1 s and up)

    register(handler, max_attempts=5)
    publish(TOPIC, {"n": 1})
    began = time.monotonic()
    summary = drain(TOPIC)
    assert time.monotonic() - began < 5
    assert (summary.handled, summary.retried, summary.dead_lettered) == (1, 2, 0)


@pytest.mark.django_db
def test_drain_stops_after_max_messages_and_hands_the_rest_back(register: Any) -> None:
    handled: list[int] = []
    register(lambda m: handled.append(m.payload["n"]), batch_size=10)
    publish_many(TOPIC, [{"payload": {"n": n}, "key": "k"} for n in range(5)])
    summary = drain(TOPIC, max_messages=2)
    assert handled == [0, 1] and summary.stopped_early
    assert drain(TOPIC).handled == 3  # the rest was handed back, not counted as an attempt
    assert handled == [0, 1, 2, 3, 4]


@pytest.mark.django_db
def test_drain_delivers_what_handlers_publish(register: Any) -> None:
    register(lambda m: publish("testing.shipping", {"order": m.payload["order"]}), group="billing")
    shipped: list[int] = []
    register(lambda m: shipped.append(m.payload["order"]), topic="testing.shipping", group="shipping")
    publish(TOPIC, {"order": 1})
    summary = drain()
    assert shipped == [1]
    assert summary[f"shipping:testing.shipping"].handled == 1  # noqa: F541


@pytest.mark.django_db
def test_drain_leaves_delayed_messages_for_later(register: Any) -> None:
    handled: list[int] = []
    register(lambda m: handled.append(m.payload["n"]))
    publish(TOPIC, {"n": 1}, delay=3600)
    publish(TOPIC, {"n": 2})
    assert drain(TOPIC).handled == 1 and handled == [2]


@pytest.mark.django_db(transaction=True)
def test_drain_with_commits(register: Any) -> None:
    register(lambda m: None, max_attempts=2)
    register(lambda m: (_ for _ in ()).throw(ValueError("poison")), topic="testing.poison", max_attempts=2)
    publish_many(TOPIC, [{"payload": {"n": n}} for n in range(30)])
    publish("testing.poison", {"n": 1})
    summary = drain()
    assert (summary.handled, summary.retried, summary.dead_lettered) == (30, 1, 1)
    assert len(dead_letters("testing.poison")) == 1


def test_process_runs_one_handler_on_one_message(register: Any) -> None:
    calls: list[ReceivedMessage] = []

    def handler(message: ReceivedMessage) -> str:
        calls.append(message)
        if message.payload.get("poison"):
            raise Reject("poison")
        return "done"

    register(handler, group="billing")
    assert process({"n": 1}, topic=TOPIC) == "done"
    assert calls[0].payload == {"n": 1} and calls[0].group == "billing" and calls[0].attempt == 1
    with pytest.raises(Reject):
        process({"poison": True}, topic=TOPIC, attempt=3)
    with pytest.raises(TestingError, match="give topic="):
        process({"n": 1})


@pytest.mark.django_db
def test_process_takes_a_captured_message(register: Any) -> None:
    async def handler(message: ReceivedMessage) -> str:
        return f"{message.key}:{message.payload['n']}"

    register(handler)
    register(lambda m: None, group="other")
    with capture_published() as published:
        publish(TOPIC, {"n": 5}, key="k")
    assert process(published[0], group="g") == "k:5"
    with pytest.raises(TestingError, match="choose one with group="):
        process(published[0])


@pytest.mark.django_db
def test_the_drain_fixture(register: Any, sqlqueue_drain: Any, sqlqueue_published: Any) -> None:
    register(lambda m: publish("testing.audit", {"seen": m.payload["n"]}))
    publish(TOPIC, {"n": 1})
    assert sqlqueue_drain(TOPIC).handled == 1
    sqlqueue_published.assert_published("testing.audit", payload={"seen": 1})


# -- a TestCase ----------------------------------------------------------------------------


class MixinTests(SQLQueueTestMixin, TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.handled: list[Any] = []
        registry.register(ConsumerSpec(topic=TOPIC, group="mixin", handler=lambda m: self.handled.append(m.payload)))
        self.addCleanup(registry.unregister, "mixin", TOPIC)

    def test_publish_assert_and_drain(self) -> None:
        response = self.client.post("/orders/", {"customer": "carol", "total": "3"})
        self.assertEqual(response.status_code, 201)
        self.assertPublished("orders.created", key="carol", payload={"total": "3"})
        self.assertNotPublished(TOPIC)
        publish(TOPIC, {"n": 1})
        self.assertPublished(TOPIC, count=1)
        summary = self.drain(TOPIC)
        self.assertEqual(summary.handled, 1)
        self.assertEqual(self.handled, [{"n": 1}])

    def test_on_commit_callbacks_run_by_django_are_not_counted_twice(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            publish(TOPIC, {"n": 1})
        self.assertPublished(TOPIC, count=1)

    def test_each_test_starts_with_an_empty_capture(self) -> None:
        self.assertEqual(len(self.published), 0)
        with self.assertRaisesMessage(AssertionError, "Nothing was published inside the capture."):
            self.assertPublished(TOPIC)


# -- the django.tasks backend ------------------------------------------------------------


@pytest.fixture
def tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


@pytest.mark.django_db
@pytest.mark.usefixtures("tasks_configured")
def test_assert_enqueued_and_drain_tasks() -> None:
    from tests.support.taskapp import tasks
    from tests.support.taskapp.models import Run

    with capture_published() as published:
        result = tasks.add.enqueue(2, 3)
        tasks.flaky.enqueue(label="flaky-drain", failures=1)
        assert_enqueued(tasks.add, args=[2, 3], count=1)
        assert_enqueued("tests.support.taskapp.tasks.flaky", kwargs={"label": "flaky-drain"})
        assert_not_enqueued(tasks.add, args=[9, 9])
        with pytest.raises(AssertionError) as failure:
            assert_enqueued(tasks.add, args=[1, 1])
    assert "tests.support.taskapp.tasks.add(args=[2, 3], kwargs={})" in str(failure.value)
    assert_enqueued(tasks.add, args=[2, 3], count=1, published=published)  # after the block: explicitly
    assert_not_enqueued(tasks.flaky, kwargs={"label": "other"}, published=published)
    with pytest.raises(TestingError, match=r"assert_enqueued\(\) needs an open capture.*published=published"):
        assert_enqueued(tasks.add)

    summary = drain_tasks()
    assert (summary.handled, summary.retried) == (2, 1)
    assert tasks.add.get_result(result.id).return_value == 5
    assert Run.objects.filter(label="flaky-drain").count() == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("tasks_configured")
def test_drain_tasks_refuses_an_unknown_queue() -> None:
    with pytest.raises(TestingError, match="no queue 'nope'"):
        drain_tasks("nope")


@pytest.mark.django_db
def test_drain_refuses_a_group_another_live_worker_holds(register: Any) -> None:
    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.db.store import QueueStore

    register(lambda m: None, group="billing")
    store = QueueStore("default")
    store.register_topic(TOPIC, get_settings().partitions_for(TOPIC))
    store.heartbeat("billing", TOPIC, "runconsumer-1")
    store.acquire_leases("billing", TOPIC, [0], "runconsumer-1", 30)
    with pytest.raises(TestingError, match=r"could lease only \d+ of its \d+ partitions.*runconsumer-1"):
        drain(TOPIC)


@pytest.mark.django_db
def test_drain_refuses_a_broken_transaction_and_bad_arguments(register: Any) -> None:
    register(lambda m: None)
    transaction.set_rollback(True)  # as after a query that failed inside the test's transaction
    try:
        with pytest.raises(TestingError, match="is broken"):
            drain(TOPIC)
    finally:
        transaction.set_rollback(False)
    with pytest.raises(TestingError, match="max_messages"):
        drain(TOPIC, max_messages=-1)
    assert drain(TOPIC, max_messages=0).handled == 0
