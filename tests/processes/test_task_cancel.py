"""Cancelling tasks while real runconsumer processes run them (slow): every cancel ends one
way -- CANCELLED and never run, or REQUESTED/FINISHED and run -- with two workers of
``--concurrency 4`` fetching, checking and starting the same tasks concurrently.
The in-process version and the single cases: tests/tasks/test_cancellation.py."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from django_sqlqueue.models import ConsumerOffset, DeliveryState, Message
from django_sqlqueue.ops.task_cancel import CANCELLED_ERROR, CancelOutcome, cancel_task
from django_sqlqueue.task_models import TaskResultRecord
from tests.support.processes import ConsumerProcess
from tests.support.task_helpers import task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


def passed(result_id: str) -> bool:
    m = Message.objects.filter(id=result_id).first()
    if m is None:
        return True  # garbage-collected: every group acked it
    if m.offset is None:
        return False
    at = {"consumer_group": "tasks", "topic": m.topic, "partition": m.partition}
    if DeliveryState.objects.filter(**at, message_offset=m.offset, acked=True).exists():
        return True
    return ConsumerOffset.objects.filter(**at, offset_acked__gte=m.offset).exists()


def test_cancels_racing_two_runconsumers_end_one_way_each(runconsumer: Callable[..., ConsumerProcess]) -> None:
    results = [tasks.sleepy.enqueue(f"c{i}", 0.05) for i in range(300)]
    for name in ("tsk-c1", "tsk-c2"):
        runconsumer(name, "--group", "tasks", "--concurrency", "4", settings="tests.support.taskapp.process_settings")
    # Some finished, most waiting or fetched: cancels meet every state.
    wait_until(lambda: Run.objects.filter(label__endswith=":start").count() >= 10, 30, "the workers to start tasks")
    outcomes: dict[str, CancelOutcome] = {}
    errors: list[BaseException] = []

    def canceller(chunk: list[Any]) -> None:
        try:
            for r in chunk:
                outcomes[r.id] = cancel_task(r.id, by="racer")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=canceller, args=(results[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    wait_until(lambda: all(passed(r.id) for r in results), 60, "every message to be passed", 0.2)
    ran = set(Run.objects.filter(label__endswith=":start").values_list("label", flat=True))
    seen: dict[CancelOutcome, int] = {}
    for i, r in enumerate(results):
        outcome, record = outcomes[r.id], TaskResultRecord.objects.get(id=r.id)
        seen[outcome] = seen.get(outcome, 0) + 1
        if outcome is CancelOutcome.CANCELLED:
            assert f"c{i}:start" not in ran, f"task {i} ran although its cancel said CANCELLED"
            assert record.status == "FAILED" and record.errors[-1]["exception_class_path"] == CANCELLED_ERROR
        else:
            assert f"c{i}:start" in ran, f"task {i} never ran although its cancel said {outcome}"
            assert record.status == "SUCCESSFUL"
    assert seen.get(CancelOutcome.CANCELLED) and len(seen) >= 2, seen
