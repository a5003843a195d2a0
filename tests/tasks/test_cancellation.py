"""tasks/cancel.py: cancel() and cancel_requested() with a real Worker (the code runconsumer runs).

Each claim is shown on a real run: a cancelled task never runs (no Run row, its message
acked for the tasks group, not dead-lettered), a running one sees its flag, and a cancel
racing with a worker fetching and starting tasks ends in exactly one consistent outcome.
The multi-process version of the race is in tests/processes (runconsumer); the decision
itself is tested in tests/ops/test_task_cancel.py.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_sqlqueue.exceptions import TaskCancelled
from django_sqlqueue.models import ConsumerOffset, DeliveryState, Message
from django_sqlqueue.ops import OperationError
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.cancellation import CancelOutcome, UnknownTask, cancel, cancel_requested
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.task_helpers import finished, running_worker, wait_until
from tests.support.taskapp.models import Run
from tests.tasks import cancel_tasks

pytestmark = pytest.mark.django_db(transaction=True)

CANCELLED_PATH = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"


def passed(result_id: str) -> bool:
    """Whether the tasks group is done with the task's message (acked, or below its watermark)."""
    m = Message.objects.get(id=result_id)
    if m.offset is None:
        return False
    at = {"consumer_group": "tasks", "topic": m.topic, "partition": m.partition}
    if DeliveryState.objects.filter(**at, message_offset=m.offset, acked=True).exists():
        return True
    return ConsumerOffset.objects.filter(**at, offset_acked__gte=m.offset).exists()


def handed_back(result_id: str) -> bool:
    """Whether the tasks group's delivery of the task's message waits for its retry (handed back)."""
    m = Message.objects.get(id=result_id)
    return DeliveryState.objects.filter(
        consumer_group="tasks",
        topic=m.topic,
        partition=m.partition,
        message_offset=m.offset,
        acked=False,
        status=DeliveryState.Status.RETRY,
    ).exists()


def assert_cancelled(result_id: str, by: str = "") -> None:
    result = cancel_tasks.mark.get_backend().get_result(result_id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == CANCELLED_PATH
    assert "cancelled" in result.errors[-1].traceback and by in result.errors[-1].traceback
    assert result.finished_at is not None


def test_cancel_a_waiting_task_it_never_runs_and_its_message_is_acked() -> None:
    doomed = cancel_tasks.mark.enqueue("doomed")
    assert cancel(doomed, by="alice") is CancelOutcome.CANCELLED
    assert_cancelled(doomed.id, "by alice")  # before any worker saw the message
    after = cancel_tasks.mark.enqueue("after")
    with running_worker():
        finished(after)
        wait_until(lambda: passed(doomed.id), 10, "the cancelled task's message to be acked")
    assert not Run.objects.filter(label="doomed").exists()
    assert Run.objects.filter(label="after").count() == 1
    assert_cancelled(doomed.id, "by alice")  # and after the worker passed it
    assert not Message.objects.filter(original_topic=Message.objects.get(id=doomed.id).topic).exists()
    assert cancel(doomed.id) is CancelOutcome.CANCELLED  # again: the same answer, nothing added
    assert len(TaskResultRecord.objects.get(id=doomed.id).errors) == 1


def test_cancel_a_scheduled_task_the_worker_parked() -> None:
    when = timezone.now() + dt.timedelta(seconds=1.5)
    later = cancel_tasks.mark.using(run_after=when).enqueue("scheduled")
    with running_worker():
        m = wait_until(lambda: Message.objects.filter(id=later.id, offset__isnull=False).first(), 10, "sequencing")
        wait_until(
            lambda: DeliveryState.objects.filter(
                consumer_group="tasks", topic=m.topic, partition=m.partition, message_offset=m.offset
            ).exists(),
            10,
            "the worker to park the scheduled task",
        )
        assert cancel(later, by="bob") is CancelOutcome.CANCELLED
        wait_until(lambda: passed(later.id), 15, "the scheduled message to be acked once due")
    assert timezone.now() > when
    assert not Run.objects.filter(label="scheduled").exists()
    assert_cancelled(later.id, "by bob")


def test_cancel_a_task_waiting_for_its_retry() -> None:
    result = cancel_tasks.retry_later.enqueue("retrying", 3.0)  # ample: the cancel lands before the retry is due
    with running_worker():
        # Waiting for its retry means both: the attempt's error is in the result row (the
        # handler writes it) and the worker has handed the message back (its nack, committed
        # just after). Between the two the worker still holds the message, and a cancel
        # then rightly answers REQUESTED (ops/task_cancel.py): the test waits for both.
        wait_until(
            lambda: (
                TaskResultRecord.objects.filter(id=result.id, status="READY").exclude(errors=[]).exists()
                and handed_back(result.id)
            ),
            10,
            "the first attempt to fail and its message to wait for its retry",
        )
        assert cancel(result.id) is CancelOutcome.CANCELLED
        wait_until(lambda: passed(result.id), 15, "the retry to be acked without running")
    assert Run.objects.filter(label="retrying").count() == 1  # the first attempt only
    fresh = cancel_tasks.retry_later.get_result(result.id)
    assert fresh.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in fresh.errors] == ["django_sqlqueue.exceptions.Retry", CANCELLED_PATH]


def test_cancel_a_running_task_it_sees_the_flag_and_returns() -> None:
    result = cancel_tasks.cooperative.enqueue("coop", 20.0)
    assert not cancel_requested(result)
    with running_worker():
        wait_until(lambda: Run.objects.filter(label="coop:start").exists(), 10, "the task to start")
        assert cancel(result, by="carol") is CancelOutcome.REQUESTED
        done = finished(result)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "stopped"
    assert Run.objects.filter(label="coop:cancel seen").count() == 1
    assert cancel_requested(result.id) and cancel_requested(done)
    assert cancel(result) is CancelOutcome.FINISHED


def test_cancel_a_finished_task_changes_nothing() -> None:
    result = cancel_tasks.mark.enqueue("done")
    with running_worker():
        finished(result)
    before = TaskResultRecord.objects.values().get(id=result.id)
    assert cancel(result) is CancelOutcome.FINISHED
    assert TaskResultRecord.objects.values().get(id=result.id) == before


def test_the_package_exports_the_api() -> None:
    import django_sqlqueue.tasks as package

    assert (package.cancel, package.cancel_requested, package.CancelOutcome) == (
        cancel,
        cancel_requested,
        CancelOutcome,
    )


def test_unknown_and_malformed_ids_are_refused_and_nothing_is_written() -> None:
    with pytest.raises(UnknownTask, match="no task has the result id 'nope'"):
        cancel("nope")
    for bad in ["", "a\nb", "x" * 200, 42]:
        with pytest.raises(OperationError):
            cancel(bad)  # type: ignore[arg-type]
        with pytest.raises(OperationError):
            cancel_requested(bad)  # type: ignore[arg-type]
    assert not TaskResultRecord.objects.exists()


def test_cancel_inside_a_transaction_is_refused() -> None:
    result = cancel_tasks.mark.enqueue("in-tx")
    with transaction.atomic(), pytest.raises(OperationError, match=r"outside transaction\.atomic"):
        cancel(result)
    assert not TaskResultRecord.objects.exists()


def test_a_cancel_after_the_batch_check_lets_the_task_run_with_its_flag() -> None:
    """The window the primary key alone cannot close: the worker checked its batch (no row),
    the task waits behind a slow one, a cancel comes: REQUESTED, and the task runs."""
    key = "one-partition"
    ahead = cancel_tasks.mark_slowly.using(queue_name="default").enqueue("ahead", 1.5)
    target = cancel_tasks.mark.enqueue("behind")
    for r in (ahead, target):  # one ordering key: one partition, one batch, in order
        Message.objects.filter(id=r.id).update(key=key)
    Message.objects.filter(id__in=[ahead.id, target.id]).update(partition=0)
    with running_worker():
        wait_until(lambda: Run.objects.filter(label="ahead").exists(), 10, "the slow task to start")
        assert cancel(target, by="dave") is CancelOutcome.REQUESTED  # the worker holds it
        done = finished(target)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert Run.objects.filter(label="behind").count() == 1
    assert TaskResultRecord.objects.get(id=target.id).cancel_requested_at is not None


def test_cancels_racing_with_a_worker_end_in_one_consistent_outcome_each() -> None:
    """Cancels on their own connections while a worker fetches and starts the same tasks:
    CANCELLED means it never ran, REQUESTED or FINISHED means it ran, for every task."""
    results = [cancel_tasks.mark_slowly.enqueue(f"race-{i}", 0.005) for i in range(120)]
    outcomes: dict[str, CancelOutcome] = {}
    errors: list[BaseException] = []

    def canceller(chunk: list[Any]) -> None:
        try:
            for r in chunk:
                outcomes[r.id] = cancel(r, by="racer")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    with running_worker():
        wait_until(lambda: Run.objects.filter(label__startswith="race-").exists(), 10, "the worker to start")
        threads = [threading.Thread(target=canceller, args=(results[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for r in results:
            wait_until(lambda r=r: passed(r.id), 30, f"task {r.id} to be passed")
    ran = set(Run.objects.filter(label__startswith="race-").values_list("label", flat=True))
    seen: dict[CancelOutcome, int] = {}
    for i, r in enumerate(results):
        outcome = outcomes[r.id]
        seen[outcome] = seen.get(outcome, 0) + 1
        record = TaskResultRecord.objects.get(id=r.id)
        if outcome is CancelOutcome.CANCELLED:
            assert f"race-{i}" not in ran, f"task {i} ran although its cancel said CANCELLED"
            assert record.status == "FAILED" and record.errors[-1]["exception_class_path"] == CANCELLED_PATH
        else:
            assert f"race-{i}" in ran, f"task {i} never ran although its cancel said {outcome}"
            assert record.status == "SUCCESSFUL"
    assert seen.get(CancelOutcome.CANCELLED) and len(seen) >= 2, seen
