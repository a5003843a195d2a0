"""tasks/precheck.py: the worker's one look per batch for result rows (a cancelled task is not run).
Against a running Worker: tests/tasks/test_cancellation.py."""

from __future__ import annotations

import pytest

from django_sqlqueue.models import Message
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks import CancelOutcome, cancel
from django_sqlqueue.tasks.precheck import check_batch, may_have_row
from tests.tasks import cancel_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_batch_check_answers_for_its_own_tasks_and_asks_for_others() -> None:
    """check_batch notes which of a batch's tasks have a row; may_have_row answers from it
    (no query) for those, and reads the row for a task outside the batch."""
    with_row, without = cancel_tasks.mark.enqueue("a"), cancel_tasks.mark.enqueue("b")
    assert cancel(with_row) is CancelOutcome.CANCELLED
    check_batch([Message.objects.get(id=with_row.id), Message.objects.get(id=without.id)])
    TaskResultRecord.objects.all().delete()  # answered from the check, not read again
    assert may_have_row(with_row.id) and not may_have_row(without.id)
    outside = cancel_tasks.mark.enqueue("c")
    assert cancel(outside) is CancelOutcome.CANCELLED
    assert may_have_row(outside.id)
