"""Small helpers of the django.tasks backend tests: settings, an in-process worker, waiting, deliveries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.test import override_settings

from tests.support.taskapp.settings_common import TASKS

#: Fast clocks for in-process workers (retries after 0.1-0.3 s).
FAST_SQLQUEUE = {
    "POLL_INTERVAL": 0.02,
    "POLL_INTERVAL_MAX": 0.1,
    "LEASE_DURATION": 3,
    "LEASE_RENEW_INTERVAL": 0.5,
    "BACKOFF_MIN": 0.1,
    "BACKOFF_MAX": 0.3,
}


def task_settings(**sqlqueue: Any) -> override_settings:
    from django.conf import settings

    base = {k: v for k, v in (getattr(settings, "SQLQUEUE", None) or {}).items() if k == "TOPICS"}
    return override_settings(TASKS=TASKS, SQLQUEUE={**base, **FAST_SQLQUEUE, **sqlqueue})


@contextmanager
def running_worker(name: str = "tsk-inproc", **kwargs: Any) -> Iterator[Any]:
    """A real Worker over the task queues, on a thread of this process (own connections)."""
    from django.db import connections

    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.tasks.discovery import task_consumer_specs
    from django_sqlqueue.worker.loop import Worker

    worker = Worker(task_consumer_specs(), name=name, conf=get_settings(), **kwargs)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "worker did not stop within 30 s"
        if errors:
            raise errors[0]


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def finished(result: Any, timeout: float = 20) -> Any:
    """Wait for task ``result`` to finish; its fresh TaskResult."""
    from tests.support.taskapp import tasks

    def done() -> Any:
        fresh = tasks.add.get_backend().get_result(result.id)
        return fresh if fresh.is_finished else None

    return wait_until(done, timeout, f"task {result.id} to finish")


def first_delivery(result: Any) -> Any:
    """The first delivery of an enqueued task, as a worker hands it to the task handler."""
    from django_sqlqueue.consumers import ReceivedMessage
    from django_sqlqueue.models import Message

    message = Message.objects.get(id=result.id)
    return ReceivedMessage(
        topic=message.topic,
        key=message.key,
        partition=message.partition,
        offset=message.offset,
        id=message.id,
        payload=message.payload,
        metadata=message.metadata,
        attempt=1,
        created_at=message.created_at,
        deliver_at=message.deliver_at,
        group="tasks",
    )


def result_statements(delivery: Any) -> list[str]:
    """Run the task handler on ``delivery`` here; the statements it sent to the results table."""
    from django.db import connection

    from django_sqlqueue.tasks.execution import TaskHandler

    statements: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    handler = TaskHandler("default", 3)
    handler.before_batch([delivery])  # as the worker does, once per fetched batch (not counted)
    with connection.execute_wrapper(spy):
        handler(delivery)
    return [s for s in statements if "queue_task_results" in s]


def delivery_row(result_id: str, status: int, *, acked: bool = False) -> None:
    """The ``tasks`` group's delivery row of task ``result_id``, as the worker's fetch writes
    it (``store.mark_delivered``): in flight, retrying or handed back; ``acked`` out of order."""
    import datetime as dt

    from django.utils import timezone

    from django_sqlqueue.models import DeliveryState, Message

    m = Message.objects.get(id=result_id)
    DeliveryState.objects.create(
        consumer_group="tasks",
        topic=m.topic,
        partition=m.partition,
        message_offset=m.offset,
        acked=acked,
        invisible_until=timezone.now() + dt.timedelta(seconds=30),
        status=status,
    )
