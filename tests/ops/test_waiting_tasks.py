"""ops/waiting_tasks.py: the tasks no worker started, read from the log on the real database --
unsequenced and sequenced messages, each state a worker or a cancel leaves (watermark, delivery
rows, result rows), priority levels, keyset pages both ways and the scan budget."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import ConsumerOffset, DeliveryState, Message
from django_sqlqueue.ops import OperationError
from django_sqlqueue.ops.task_cancel import CancelOutcome, cancel_task
from django_sqlqueue.ops.waiting_tasks import SCAN_FACTOR, list_waiting, task_topics
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.task_helpers import delivery_row, task_settings
from tests.support.taskapp import tasks
from tests.support.taskapp.settings_common import TASKS

pytestmark = pytest.mark.django_db(transaction=True)
PRIORITY_TASKS = {"default": {**TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 3, "PRIORITIES": [10, 0, -5]}}}


@pytest.fixture(autouse=True)
def _tasks() -> Iterator[None]:
    with task_settings():
        yield


def sequenced(*ids: str) -> None:
    for topic in {Message.objects.get(id=i).topic for i in ids}:
        sequence(topic)


def ids(**kw: Any) -> list[str]:
    return [t.id for t in list_waiting(**kw).items]


def all_pages(order: str, limit: int) -> list[str]:
    seen, cursor = [], None
    for _ in range(100):
        page = list_waiting(order=order, cursor=cursor, limit=limit)
        assert len(page.items) <= limit
        seen += [t.id for t in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return seen
    raise AssertionError("pages never ended")


def row(result_id: str, status: str, started: bool = True) -> None:
    TaskResultRecord.objects.create(
        id=result_id,
        backend="default",
        queue_name="default",
        topic="tasks.default",
        task_path="tests.support.taskapp.tasks.add",
        status=status,
        started_at=timezone.now() if started else None,
    )


def test_unsequenced_then_sequenced_waiting_tasks_are_listed_with_their_fields() -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    a = tasks.add.enqueue(1, 2).id
    b = tasks.add.using(run_after=later).enqueue(3, 4).id
    c = tasks.add.using(queue_name="other").enqueue(5, 6).id
    page = list_waiting()
    assert {t.id for t in page.items} == {a, b, c} and page.next_cursor is None
    assert all(t.offset is None for t in page.items)  # not numbered yet: listed all the same
    sequenced(a, c)
    by_id = {t.id: t for t in list_waiting().items}
    assert set(by_id) == {a, b, c} and all(t.offset is not None for t in by_id.values())
    t = by_id[b]
    assert (t.backend, t.queue_name, t.priority) == ("default", "default", 0)
    assert t.task_path == "tests.support.taskapp.tasks.add"
    assert (json.loads(t.args.text), t.args.cut, json.loads(t.kwargs.text)) == ([3, 4], False, {})
    assert t.run_after == later and by_id[a].run_after is None and t.enqueued_at <= timezone.now()
    assert by_id[c].queue_name == "other"


def test_bounded_arguments_and_not_a_task_message_left_out() -> None:
    big = tasks.add.enqueue("x" * 5000, 1).id
    Message.objects.create(
        topic="tasks.default",
        partition=0,
        id="not-a-task",
        payload={"hello": 1},
        deliver_at=timezone.now(),
        created_at=timezone.now(),
        published_at=timezone.now(),
    )
    (t,) = list_waiting().items
    assert t.id == big and t.args.cut and len(t.args.text) == 200 and t.args.length > 5000


def test_started_finished_held_acked_and_cancelled_tasks_are_not_listed() -> None:
    names = ["wait", "pending", "running", "done", "held", "acked", "parked", "below", "cancelled"]
    rid = {n: tasks.add.enqueue(i, 0).id for i, n in enumerate(names)}
    sequenced(*rid.values())
    row(rid["running"], "RUNNING")
    row(rid["done"], "SUCCESSFUL")
    row(rid["pending"], "READY", started=False)
    TaskResultRecord.objects.filter(id=rid["pending"]).update(cancel_requested_at=timezone.now())
    delivery_row(rid["held"], DeliveryState.Status.IN_FLIGHT)  # a first attempt: its row is written lazily
    delivery_row(rid["acked"], DeliveryState.Status.IN_FLIGHT, acked=True)  # acked out of order, row pruned
    delivery_row(rid["parked"], DeliveryState.Status.SCHEDULED)  # handed back: waits again
    m = Message.objects.get(id=rid["below"])
    offsets = Message.objects.filter(topic=m.topic, partition=m.partition).values_list("offset", flat=True)
    assert m.offset == min(offsets)
    now = timezone.now()
    ConsumerOffset.objects.create(
        consumer_group="tasks", topic=m.topic, partition=m.partition, offset_acked=m.offset, updated_at=now
    )
    assert cancel_task(rid["cancelled"], by="op") is CancelOutcome.CANCELLED
    # Another group's watermark does not hide anything.
    ConsumerOffset.objects.create(
        consumer_group="other", topic=m.topic, partition=m.partition, offset_acked=10**6, updated_at=now
    )
    page = list_waiting()
    assert {t.id for t in page.items} == {rid["wait"], rid["pending"], rid["parked"]}
    assert [t.cancel_requested for t in page.items if t.id == rid["pending"]] == [True]


def test_priority_levels_are_task_topics() -> None:
    with override_settings(TASKS=PRIORITY_TASKS):
        topics = {t.topic: t.level for t in task_topics()}
        assert topics == {
            "tasks.default": 0,
            "tasks.default.p10": 10,
            "tasks.default.p-5": -5,
            "tasks.other": 0,
            "tasks.other.p10": 10,
            "tasks.other.p-5": -5,
        }
        high = tasks.add.using(priority=10).enqueue(1, 1).id
        low = tasks.add.using(priority=-5, queue_name="other").enqueue(2, 2).id
        sequenced(high, low)
        by_id = {t.id: t for t in list_waiting().items}
        assert (by_id[high].priority, by_id[high].queue_name) == (10, "default")
        assert (by_id[low].priority, by_id[low].queue_name) == (-5, "other")


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_keyset_pages_cover_every_waiting_task_once_in_partition_order(order: str) -> None:
    made = [tasks.add.using(queue_name=("default", "other")[i % 2]).enqueue(i, i).id for i in range(11)]
    sequenced(*made)
    unsequenced = tasks.add.enqueue(99, 99)  # published after the others were sequenced
    seen = all_pages(order, 3)
    assert sorted(seen) == sorted([*made, unsequenced.id]) and len(seen) == len(set(seen))
    assert seen[0] == unsequenced.id  # unsequenced first, on the first page
    keys = {m.id: (m.topic, m.partition, m.offset) for m in Message.objects.filter(id__in=made)}
    positions = [keys[i] for i in seen[1:]]
    assert positions == sorted(positions, reverse=order == "newest")
    # A page of unsequenced messages only continues with the sequenced ones.
    first = list_waiting(order=order, limit=1)
    assert [t.id for t in first.items] == [unsequenced.id]
    assert list_waiting(order=order, cursor=first.next_cursor, limit=1).items[0].offset is not None


def test_a_page_stops_after_its_scan_budget_with_a_cursor() -> None:
    done = [tasks.add.enqueue(i, 0).id for i in range(SCAN_FACTOR * 2 + 3)]
    waiting = tasks.add.enqueue(7, 7).id
    # One partition, the waiting task last in it (the sequencer numbers in publishing order).
    Message.objects.filter(topic="tasks.default").update(partition=0)
    sequenced(waiting)
    assert Message.objects.get(id=waiting).offset == len(done) + 1
    TaskResultRecord.objects.bulk_create(
        TaskResultRecord(
            id=i,
            backend="default",
            queue_name="default",
            topic="tasks.default",
            task_path="tests.support.taskapp.tasks.add",
            status="SUCCESSFUL",
            started_at=timezone.now(),
        )
        for i in done
    )
    first = list_waiting(limit=1)
    assert first.items == [] and first.next_cursor is not None  # SCAN_FACTOR messages examined, none kept
    assert all_pages("oldest", 1) == [waiting]


def test_bad_order_and_cursor_are_refused() -> None:
    with pytest.raises(OperationError, match="order must be one of"):
        list_waiting(order="sideways")
    with pytest.raises(OperationError, match="cursor must be"):
        list_waiting(cursor="tasks.default|x|1")
    with pytest.raises(OperationError, match="limit"):
        list_waiting(limit=0)


def test_no_tasks_backend_lists_nothing() -> None:
    with override_settings(TASKS={}):
        assert task_topics() == [] and list_waiting().items == []
