"""ops/tasks.py: the console's list and detail of task results, and retrying a failed task.

Real database; result rows written with the ORM as the worker writes them, and for the
retry a real enqueue, a real Worker thread (tests/support/task_helpers.py) and the replay.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import NotFound, OperationError
from django_sqlqueue.ops.tasks import (
    CANCELLED_ERROR,
    LIST_ERRORS_LENGTH,
    LIST_PREVIEW_LENGTH,
    TaskFilter,
    dead_letter_of,
    get_task,
    list_tasks,
    retry_task,
)
from django_sqlqueue.task_models import TaskResultRecord

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def record(rid: str, *, minute: int, status: str = "SUCCESSFUL", errors: list | None = None, **kw) -> TaskResultRecord:
    finished = status in ("SUCCESSFUL", "FAILED")
    fields = {
        "backend": "default",
        "queue_name": "default",
        "topic": "tasks.default",
        "task_path": "shop.tasks.send_mail",
        "status": status,
        "args": [rid],
        "kwargs": {},
        "enqueued_at": T0 + dt.timedelta(minutes=minute),
        "started_at": T0 + dt.timedelta(minutes=minute),
        "finished_at": T0 + dt.timedelta(minutes=minute, seconds=30) if finished else None,
        "errors": errors or [],
        "worker_ids": ["host:1"] * max(1, len(errors or [])),
        **kw,
    }
    return TaskResultRecord.objects.create(id=rid, **fields)


def error(cls: str, text: str = "boom") -> dict[str, str]:
    return {"exception_class_path": cls, "traceback": f"Traceback (most recent call last):\n{cls}: {text}\n"}


@pytest.mark.django_db
def test_list_newest_first_filtered_and_paginated_by_keyset():
    record("a", minute=1)
    record("b", minute=2, status="FAILED", errors=[error("builtins.ValueError")] * 3)
    record("c", minute=3, status="RUNNING")
    record("d", minute=4, status="FAILED", errors=[error("builtins.ValueError"), error(CANCELLED_ERROR)])
    # Cancelled once, retried, then failed for another reason: FAILED, not CANCELLED.
    record("e", minute=5, status="FAILED", errors=[error(CANCELLED_ERROR), error("builtins.KeyError")])
    record("f", minute=6, queue_name="other", task_path="shop.tasks.resize")
    record("g", minute=7, status="READY")

    assert [t.id for t in list_tasks().items] == ["g", "f", "e", "d", "c", "b", "a"]
    first = list_tasks(limit=3)
    assert [t.id for t in first.items] == ["g", "f", "e"] and first.next_cursor
    second = list_tasks(cursor=first.next_cursor, limit=3)
    assert [t.id for t in second.items] == ["d", "c", "b"]
    third = list_tasks(cursor=second.next_cursor, limit=3)
    assert [t.id for t in third.items] == ["a"] and third.next_cursor is None

    assert [t.id for t in list_tasks(TaskFilter(status="FAILED")).items] == ["e", "d", "b"]
    cancelled = list_tasks(TaskFilter(status="CANCELLED")).items
    assert [(t.id, t.shown_status) for t in cancelled] == [("d", "CANCELLED")]
    assert {t.id: t.shown_status for t in list_tasks().items}["e"] == "FAILED"
    assert [t.id for t in list_tasks(TaskFilter(status="RUNNING")).items] == ["c"]
    assert [t.id for t in list_tasks(TaskFilter(queue="other")).items] == ["f"]
    # A task by its full path or by the end of it; never by a part of a name.
    assert [t.id for t in list_tasks(TaskFilter(task="resize")).items] == ["f"]
    assert [t.id for t in list_tasks(TaskFilter(task="shop.tasks.resize")).items] == ["f"]
    assert list_tasks(TaskFilter(task="size")).items == []
    b = next(t for t in list_tasks().items if t.id == "b")
    assert b.attempts == 3 and b.last_error_class == "builtins.ValueError"


@pytest.mark.django_db
def test_finished_statuses_page_by_finished_at():
    record("late-enqueued-early-finish", minute=10, finished_at=T0 + dt.timedelta(minutes=11))
    record("early-enqueued-late-finish", minute=1, finished_at=T0 + dt.timedelta(minutes=20))
    page = list_tasks(TaskFilter(status="SUCCESSFUL"), limit=1)
    assert [t.id for t in page.items] == ["early-enqueued-late-finish"]
    assert [t.id for t in list_tasks(TaskFilter(status="SUCCESSFUL"), cursor=page.next_cursor).items] == [
        "late-enqueued-early-finish"
    ]


@pytest.mark.django_db
def test_list_rows_are_bounded_by_the_database():
    huge = "x" * 100_000
    record("big", minute=1, status="FAILED", args=[huge], kwargs={"k": huge}, errors=[error("builtins.E", huge)])
    record("small", minute=2, status="FAILED", errors=[error("builtins.ValueError")])
    rows = {t.id: t for t in list_tasks().items}
    big = rows["big"]
    assert len(big.args.text) == LIST_PREVIEW_LENGTH and big.args.cut and big.args.length > 100_000
    assert len(big.kwargs.text) == LIST_PREVIEW_LENGTH and big.kwargs.cut
    assert big.errors is None  # longer than LIST_ERRORS_LENGTH: on the task's own page only
    assert rows["small"].errors and not rows["small"].args.cut and rows["small"].args.text.startswith('["small"')
    assert LIST_ERRORS_LENGTH < 100_000
    assert get_task("big").args == [huge]  # the detail has it all


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"f": TaskFilter(), "cursor": "nonsense"}, "cursor must be"),
        ({"f": TaskFilter(), "cursor": "2026-01-01T00:00:00|x"}, "cursor must be"),  # naive
        ({"f": TaskFilter(), "limit": 0}, "limit must be"),
    ],
)
def test_bad_input_is_refused(kwargs, message):
    with pytest.raises(OperationError, match=message):
        list_tasks(**kwargs)


def test_unknown_status_is_refused():
    with pytest.raises(OperationError, match="status must be one of"):
        TaskFilter(status="DONE")


@pytest.mark.django_db
def test_detail_of_a_result_row():
    html = "<script>alert(1)</script>"
    record("r1", minute=1, status="FAILED", errors=[error("builtins.ValueError", html)], key="customer-7")
    t = get_task("r1")
    assert (t.status, t.shown_status, t.key, t.from_message) == ("FAILED", "FAILED", "customer-7", False)
    assert html in t.errors[0]["traceback"] and t.worker_ids == ["host:1"]
    assert t.dead_letter_seq is None and not t.can_retry and not t.can_cancel
    with pytest.raises(NotFound):
        get_task("nope")
    with pytest.raises(NotFound):
        get_task("x" * 10_000)


@pytest.mark.django_db(transaction=True)
def test_a_task_nobody_started_is_read_from_its_message():
    from tests.support.task_helpers import task_settings
    from tests.support.taskapp import tasks

    with task_settings():
        result = tasks.add.enqueue(2, 3)
        t = get_task(result.id)
    assert (t.status, t.from_message, t.args, t.task_path) == ("READY", True, [2, 3], "tests.support.taskapp.tasks.add")
    assert t.can_cancel and not t.can_retry and t.queue_name == "default"


@pytest.mark.django_db(transaction=True)
def test_retry_a_failed_task_runs_it_again_under_the_same_result():
    from django_sqlqueue.tasks.compat import TaskResultStatus
    from tests.support.task_helpers import finished, running_worker, task_settings, wait_until
    from tests.support.taskapp import tasks

    with task_settings():
        result = tasks.flaky.enqueue("ops-retry", 3)  # fails MAX_ATTEMPTS (3) times, then would succeed
        with running_worker():
            assert finished(result).status == TaskResultStatus.FAILED
            dead = wait_until(lambda: dead_letter_of(result.id, "tasks.default"), 10, "the dead letter")
            t = get_task(result.id)
            assert t.dead_letter_seq == dead.seq and t.can_retry and t.shown_status == "FAILED"
            assert retry_task(result.id, actor="ops", dry_run=True).done == 1  # nothing written
            batches = []
            done = retry_task(result.id, actor="ops", on_batch=batches.append)
            assert done.done == 1 and len(batches) == 1
            with pytest.raises(OperationError, match="no dead letter"):
                retry_task(result.id, actor="ops")  # once only
            again = finished(result)
    assert again.status == TaskResultStatus.SUCCESSFUL and len(again.errors) == 3
    assert not Message.objects.filter(topic="tasks.default_dlq").exists()


@pytest.mark.django_db
def test_the_dead_letter_of_a_retried_copy_that_failed_again_is_found():
    from django_sqlqueue.db.store.messages import write_dead_letter

    for dead_id in ("tasks:other-r2", "tasks:r2@replay17"):
        write_dead_letter(
            "tasks.default_dlq",
            key="",
            id=dead_id,
            payload={"task": "x.y"},
            metadata={},
            created_at=timezone.now(),
            failure_count=3,
            last_error="builtins.ValueError: no",
            original_topic="tasks.default",
            using="default",
        )
    found = dead_letter_of("r2", "tasks.default")
    assert found is not None and found.id == "tasks:r2@replay17"
    assert dead_letter_of("r", "tasks.default") is None  # no id that merely starts or ends alike


@pytest.mark.django_db
def test_a_task_names_its_batch_from_its_message():
    from django_sqlqueue import publish

    payload = {"task": "shop.tasks.resize", "args": [1], "kwargs": {}, "queue_name": "default", "batch": "b-7"}
    publish("tasks.default", payload, id="member-1", metadata={"task": "shop.tasks.resize"})
    publish("tasks.default", {"task": "shop.tasks.resize"}, id="not-a-task")  # no marker in its metadata
    t = get_task("member-1")
    assert (t.batch_id, t.from_message, t.args) == ("b-7", True, [1])
    with pytest.raises(NotFound):
        get_task("not-a-task")
