"""tasks/batches.py and tasks/batch_members.py: batches of tasks with one callback, enqueued once.

Real database, real workers (``drain_tasks``: the worker's batch runner on this thread;
``running_worker``: a Worker thread). The kill -9 claim is in
tests/processes/test_batches.py; the store's half of "counted once" (a second ack of the
same message reports nothing) in tests/db/store/test_settle.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.consumers import ReceivedMessage
from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskBatch, TaskResultRecord
from django_sqlqueue.tasks import BatchError, batch, enqueue_batch
from django_sqlqueue.tasks.batch_members import BATCH_KEY, batch_fields
from django_sqlqueue.tasks.batches import BatchSettlement, callback_id
from django_sqlqueue.tasks.compat import TaskResultStatus
from django_sqlqueue.tasks.execution import handler_for
from django_sqlqueue.testing.tasks import drain_tasks
from tests.support.task_helpers import running_worker, wait_until
from tests.support.taskapp import batch_tasks as bt
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

pytestmark = pytest.mark.django_db(transaction=True)


def callbacks(batch_id: str) -> list[str]:
    """The labels of the callback's runs for ``batch_id`` (``done:<total>:<succeeded>:<failed>``)."""
    return list(Run.objects.filter(key=batch_id, label__startswith="done").values_list("label", flat=True))


def callback_messages(batch_id: str) -> int:
    return Message.objects.filter(id=callback_id(batch_id)).count()


def test_counts_and_callback_arguments_with_failed_and_rejected_members() -> None:
    with batch(on_finish=bt.done, metadata={"import": 42, "seq": 7}) as b:
        ok = [bt.member.enqueue(f"m{i}", seq=i) for i in range(3)]
        bt.failing_member.enqueue("f")
        bt.rejected_member.enqueue("r")
    assert b.total == 5 and len(b.id) == 32
    row = TaskBatch.objects.get(id=b.id)
    assert (row.total, row.succeeded, row.failed, row.finished_at) == (5, 0, 0, None)
    assert all(Message.objects.get(id=r.id).payload[BATCH_KEY] == b.id for r in ok)
    drain_tasks()
    row.refresh_from_db()
    assert (row.total, row.succeeded, row.failed) == (5, 3, 2)
    assert row.finished_at is not None and row.callback_id == callback_id(b.id)
    assert callbacks(b.id) == ["done:5:3:2"]
    assert Run.objects.filter(label="f").count() == 2  # failed for good after its last attempt
    result = bt.done.get_result(row.callback_id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.kwargs == {
        "batch_id": b.id,
        "total": 5,
        "succeeded": 3,
        "failed": 2,
        "metadata": {"import": 42, "seq": 7},
    }
    assert result.args == []


def test_an_empty_batch_enqueues_its_callback_when_the_block_closes() -> None:
    with batch(on_finish=bt.done) as b:
        pass
    row = TaskBatch.objects.get(id=b.id)
    assert (row.total, row.callback_id) == (0, callback_id(b.id)) and row.finished_at is not None
    assert callback_messages(b.id) == 1
    drain_tasks()
    assert callbacks(b.id) == ["done:0:0:0"]


def test_the_function_form_and_a_callback_taking_any_keyword_arguments() -> None:
    b = enqueue_batch(bt.done_with_kwargs, [(bt.member, ("x",), {"seq": 1}), (bt.member, ("y",), {})])
    assert b.total == 2
    drain_tasks()
    assert list(Run.objects.filter(key=b.id).values_list("label", flat=True)) == ["done-kwargs"]
    assert TaskBatch.objects.get(id=b.id).succeeded == 2


def test_a_batch_inside_a_rolled_back_transaction_writes_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        with batch(on_finish=bt.done) as b:
            bt.member.enqueue("a")
        raise RuntimeError("the caller rolls back")
    with pytest.raises(ValueError), batch(on_finish=bt.done):
        bt.member.enqueue("b")
        raise ValueError("the block itself fails")
    assert not TaskBatch.objects.exists() and not Message.objects.exists()
    assert b.total == 1
    assert bt.member.enqueue("after").id  # no batch any more: a plain task
    assert BATCH_KEY not in Message.objects.get().payload


@pytest.mark.parametrize(
    ("on_finish", "metadata", "error"),
    [
        (lambda **kw: None, None, "on_finish must be a task"),
        (bt.not_a_callback, None, "must accept the keyword arguments batch_id, total, succeeded, failed, metadata"),
        (bt.done, {"when": object()}, "metadata must be JSON-serialisable"),
        (bt.done, ["not", "a", "mapping"], "metadata must be a mapping"),
    ],
)
def test_bad_input_raises_batch_error_and_writes_nothing(on_finish: Any, metadata: Any, error: str) -> None:
    with pytest.raises(BatchError, match=error), batch(on_finish=on_finish, metadata=metadata):
        bt.member.enqueue("never")
    assert not TaskBatch.objects.exists() and not Message.objects.exists()


def test_a_member_of_another_backend_is_refused() -> None:
    with batch(on_finish=bt.done) as b:
        with pytest.raises(BatchError, match="a task of backend 'other' was enqueued inside a batch of backend"):
            batch_fields("other")
    assert b.total == 0


def _die_after_the_task(result_ids: list[str], attempt: int = 1) -> None:
    """What a worker killed right after its tasks finished leaves: the deliveries recorded (its
    poll's ``mark_delivered``, a short lease and visibility), the handler run (result rows
    written), no ack. ``attempt``: the attempt number the handler is told."""
    from tests.support.engine_helpers import fetch_fresh, leased, sequence, store

    messages = [Message.objects.get(id=i) for i in result_ids]
    topic = messages[0].topic
    sequence(topic)
    store().ensure_offsets("tasks", topic, sorted({m.partition for m in messages}))
    for m in messages:
        leased("tasks", topic, m.partition, "dead-worker", duration=0.5)
        fetched = [f for f in fetch_fresh("tasks", topic, m.partition) if f.id == m.id]
        assert store().mark_delivered("tasks", topic, "dead-worker", fetched, [], [], 0.5) == {m.partition}
        received = ReceivedMessage(
            topic=topic, key=m.key, partition=m.partition, offset=fetched[0].offset, id=m.id, payload=m.payload,
            metadata=m.metadata, attempt=attempt, created_at=m.created_at, deliver_at=m.deliver_at, group="tasks",
        )  # fmt: skip
        try:
            handler_for("default", 3)(received)
        except Exception:  # noqa: BLE001 - a failed last attempt raises; its dead letter is never written
            pass


def test_a_redelivered_member_that_had_finished_counts_once_with_its_ack() -> None:
    with batch(on_finish=bt.done) as b:
        ran = bt.member.enqueue("ran", seq=1)
        failed = bt.failing_member.enqueue("failed")
    _die_after_the_task([ran.id])
    _die_after_the_task([failed.id], attempt=2)  # its last attempt: FAILED, then the worker "died"
    assert TaskResultRecord.objects.get(id=failed.id).status == "FAILED"
    assert TaskBatch.objects.get(id=b.id).succeeded == 0  # the run does not count: the ack does
    with running_worker():  # takes the dead worker's partitions once their leases expire
        wait_until(lambda: callbacks(b.id), 30, "the callback to run")
    assert Run.objects.filter(label="ran").count() == 1  # found finished, not run again
    assert Run.objects.filter(label="failed").count() == 1
    row = TaskBatch.objects.get(id=b.id)
    assert (row.succeeded, row.failed) == (1, 1)
    assert callbacks(b.id) == ["done:2:1:1"] and callback_messages(b.id) == 1


def test_members_of_an_atomic_queue_are_counted_in_the_transaction_that_acks_them() -> None:
    atomic = {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], "ATOMIC": "batch"}}}
    with override_settings(TASKS=atomic):
        with batch(on_finish=bt.done) as b:
            for i in range(4):
                bt.member.enqueue("atomic", seq=i)
            bt.rejected_member.enqueue("rejected")
        drain_tasks()
    row = TaskBatch.objects.get(id=b.id)
    assert (row.total, row.succeeded, row.failed) == (5, 4, 1)
    assert callbacks(b.id) == ["done:5:4:1"]


def test_concurrent_counts_of_one_batch_from_many_transactions_fire_the_callback_once() -> None:
    """The hot row under real concurrent transactions (threads with their own connections):
    every count lands, and exactly one transaction -- the one that completes the batch --
    enqueues the callback."""
    members = 24
    with batch(on_finish=bt.done) as b:
        ids = [bt.member.enqueue("c", seq=i).id for i in range(members)]
    settlement, errors = BatchSettlement(), []
    start = threading.Barrier(8)

    def ack(chunk: list[str]) -> None:
        try:
            start.wait(10)
            for result_id in chunk:
                with transaction.atomic(), connections["default"].cursor() as cursor:
                    settlement.settled(cursor, [(b.id, result_id)], [])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ack, args=(ids[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    row = TaskBatch.objects.get(id=b.id)
    assert (row.succeeded, row.failed, row.callback_id) == (members, 0, callback_id(b.id))
    assert callback_messages(b.id) == 1
    # A finished batch counts nothing more, and never fires again.
    with transaction.atomic(), connections["default"].cursor() as cursor:
        settlement.settled(cursor, [(b.id, ids[0])], [(b.id, ids[1])])
    row.refresh_from_db()
    assert (row.succeeded, row.failed) == (members, 0) and callback_messages(b.id) == 1


def test_plain_messages_and_replayed_members_have_no_token() -> None:
    settlement = BatchSettlement()

    class M:
        def __init__(self, payload: Any) -> None:
            self.payload, self.id = payload, "m1"

    assert settlement.key_of(M({"task": "x"})) is None  # type: ignore[arg-type]
    assert settlement.key_of(M("not a dict")) is None  # type: ignore[arg-type]
    assert settlement.key_of(M({BATCH_KEY: "b1", "result_id": "r"})) is None  # type: ignore[arg-type]
    assert settlement.key_of(M({BATCH_KEY: "b1"})) == ("b1", "m1")  # type: ignore[arg-type]


def test_the_callback_is_finished_without_a_message_when_its_task_is_gone() -> None:
    with batch(on_finish=bt.done) as b:
        bt.member.enqueue("gone")
    TaskBatch.objects.filter(id=b.id).update(on_finish="tests.support.taskapp.batch_tasks.removed")
    drain_tasks()
    row = TaskBatch.objects.get(id=b.id)
    assert row.finished_at is not None and row.finished_at <= timezone.now()
    assert (row.succeeded, row.callback_id) == (1, "")
    assert callback_messages(b.id) == 0
