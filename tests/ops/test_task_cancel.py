"""ops/task_cancel.py: the decision of a cancel, on the real database, each state set up as the
worker leaves it (result rows, delivery rows); the race with a worker's locked begin on real
concurrent connections. Cancels against a running Worker: tests/tasks/test_cancellation.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.models import DeliveryState, Message
from django_sqlqueue.ops import OperationError
from django_sqlqueue.ops.task_cancel import CANCELLED_ERROR, CancelOutcome, _backends, cancel_task
from django_sqlqueue.rules import dlq
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks import results
from django_sqlqueue.tasks.compat import task_backends
from tests.support.task_helpers import delivery_row, task_settings
from tests.support.taskapp import tasks
from tests.support.taskapp.settings_common import TASKS

pytestmark = pytest.mark.django_db(transaction=True)
IN_FLIGHT, RETRY, SCHEDULED = (
    DeliveryState.Status.IN_FLIGHT,
    DeliveryState.Status.RETRY,
    DeliveryState.Status.SCHEDULED,
)
_offsets = iter(range(1, 10**6))


@pytest.fixture(autouse=True)
def _tasks() -> Iterator[None]:
    with task_settings():
        yield


def enqueued(*args: Any) -> str:
    """A task message as the sequencer leaves it (an offset); its result id."""
    result = tasks.add.enqueue(*args or (1, 2))
    Message.objects.filter(id=result.id).update(offset=next(_offsets))
    return result.id


def row(result_id: str, status: str, **fields: Any) -> TaskResultRecord:
    return TaskResultRecord.objects.create(
        id=result_id,
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path="tests.support.taskapp.tasks.add",
        status=status,
        started_at=timezone.now(),
        **fields,
    )


def test_a_waiting_task_is_cancelled_with_a_full_row() -> None:
    rid = enqueued(4, 5)
    assert cancel_task(rid, by="alice") is CancelOutcome.CANCELLED
    r = TaskResultRecord.objects.get(id=rid)
    assert (r.status, r.backend, r.queue_name, r.topic, r.args) == (
        "FAILED",
        "default",
        "default",
        "tasks.default",
        [4, 5],
    )
    assert r.task_path == "tests.support.taskapp.tasks.add" and r.enqueued_at is not None
    assert r.started_at is None and r.finished_at is not None and r.cancel_requested_at is not None
    assert r.errors == [{"exception_class_path": CANCELLED_ERROR, "traceback": r.errors[0]["traceback"]}]
    assert "cancelled by alice at" in r.errors[0]["traceback"]
    assert tasks.add.get_result(rid).status == "FAILED"


@pytest.mark.parametrize("status", [SCHEDULED, RETRY])
def test_a_parked_or_handed_back_delivery_is_cancelled(status: int) -> None:
    rid = enqueued()
    delivery_row(rid, status)
    assert cancel_task(rid) is CancelOutcome.CANCELLED


def test_a_message_a_worker_holds_is_requested_not_cancelled() -> None:
    rid = enqueued()
    delivery_row(rid, IN_FLIGHT)
    assert cancel_task(rid, by="bob") is CancelOutcome.REQUESTED
    r = TaskResultRecord.objects.get(id=rid)
    assert r.status == "RUNNING" and r.cancel_requested_at is not None and r.started_at is not None
    assert r.errors == []


def test_a_running_task_gets_its_flag_once() -> None:
    rid = enqueued()
    row(rid, "RUNNING")
    assert cancel_task(rid) is CancelOutcome.REQUESTED
    first = TaskResultRecord.objects.get(id=rid).cancel_requested_at
    assert first is not None
    assert cancel_task(rid) is CancelOutcome.REQUESTED
    assert TaskResultRecord.objects.get(id=rid).cancel_requested_at == first


def test_a_task_waiting_for_its_retry_is_cancelled_keeping_its_errors() -> None:
    rid = enqueued()
    earlier = {"exception_class_path": "builtins.ValueError", "traceback": "boom"}
    row(rid, "READY", errors=[earlier], worker_ids=["w:1"])
    delivery_row(rid, RETRY)
    assert cancel_task(rid) is CancelOutcome.CANCELLED
    r = TaskResultRecord.objects.get(id=rid)
    assert r.status == "FAILED" and [e["exception_class_path"] for e in r.errors] == [
        "builtins.ValueError",
        CANCELLED_ERROR,
    ]


@pytest.mark.parametrize("status", ["SUCCESSFUL", "FAILED"])
def test_a_finished_task_is_left_alone(status: str) -> None:
    rid = enqueued()
    row(rid, status, finished_at=timezone.now())
    before = TaskResultRecord.objects.values().get(id=rid)
    assert cancel_task(rid) is CancelOutcome.FINISHED
    assert TaskResultRecord.objects.values().get(id=rid) == before


def test_an_acked_message_without_a_row_is_finished_and_nothing_is_written() -> None:
    rid = enqueued()
    delivery_row(rid, IN_FLIGHT, acked=True)  # its row was pruned
    assert cancel_task(rid) is CancelOutcome.FINISHED
    assert not TaskResultRecord.objects.exists()


def test_unknown_ids_write_nothing() -> None:
    assert cancel_task("no-such-task") is CancelOutcome.UNKNOWN
    rid = enqueued()
    Message.objects.filter(id=rid).delete()
    assert cancel_task(rid) is CancelOutcome.UNKNOWN
    assert not TaskResultRecord.objects.exists()


def test_a_dead_lettered_task_without_a_row_is_finished() -> None:
    rid = enqueued()
    m = Message.objects.get(id=rid)
    Message.objects.filter(id=rid).update(topic="tasks.default_dlq", id=dlq.dead_letter_id("tasks", rid), offset=None)
    assert m.topic == "tasks.default"
    assert cancel_task(rid) is CancelOutcome.FINISHED
    assert not TaskResultRecord.objects.exists()


@pytest.mark.parametrize("bad", ["", "a\nb", "x" * 129, 7, None, "id@replay1"])
def test_malformed_ids_are_refused(bad: Any) -> None:
    with pytest.raises(OperationError):
        cancel_task(bad)
    assert not TaskResultRecord.objects.exists()


def test_a_bad_by_is_refused() -> None:
    rid = enqueued()
    with pytest.raises(OperationError, match="by must be a str"):
        cancel_task(rid, by=3)  # type: ignore[arg-type]
    assert not TaskResultRecord.objects.exists()


def test_the_backends_read_from_settings_agree_with_the_backend() -> None:
    other = {
        "BACKEND": "django_sqlqueue.tasks.SQLQueueBackend",
        "QUEUES": ["q1"],
        "OPTIONS": {"GROUP": "workers2"},
    }
    with override_settings(TASKS={**TASKS, "second": other}):
        found = _backends()
        for alias in ("default", "second"):
            backend: Any = task_backends[alias]
            b = found[alias]
            assert {q: b.topic_prefix + q for q in b.queues} == backend.topics()
            assert b.group == backend.sqlqueue.group


def test_two_concurrent_cancels_agree_and_add_one_error() -> None:
    rid = enqueued()
    outcomes = race([lambda: cancel_task(rid, by="a"), lambda: cancel_task(rid, by="b")])
    assert outcomes == [CancelOutcome.CANCELLED, CancelOutcome.CANCELLED]
    assert len(TaskResultRecord.objects.get(id=rid).errors) == 1


def test_a_cancel_racing_a_workers_locked_begin_ends_one_way() -> None:
    """A redelivered attempt begins under the row's lock (results.begin); a cancel's
    compare-and-set and it are serialized: never both "cancelled" and "begun"."""
    for i in range(15):
        rid = enqueued()
        row(rid, "READY", errors=[{"exception_class_path": "builtins.ValueError", "traceback": "x"}])
        delivery_row(rid, RETRY)
        m = Message.objects.get(id=rid)

        def begin(rid: str = rid, m: Message = m) -> Any:
            return results.begin(
                backend_alias="default",
                result_id=rid,
                payload=m.payload,
                topic=m.topic,
                key=m.key,
                enqueued_at=m.created_at,
                worker_id="w:2",
                earlier_attempts=1,
            )

        outcome, begun = race([lambda rid=rid: cancel_task(rid), begin])
        status = TaskResultRecord.objects.get(id=rid).status
        if outcome is CancelOutcome.CANCELLED:
            assert begun is None and status == "FAILED", i
        else:
            assert outcome is CancelOutcome.REQUESTED and begun is not None and status == "RUNNING", i


def race(calls: list[Any]) -> list[Any]:
    """Run ``calls`` at once, each on a thread of its own (its own connection); their results."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            out[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return out
