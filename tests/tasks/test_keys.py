"""tasks/keys.py: ordering keys -- tasks enqueued with one key run in enqueue order.

Real database, real Worker threads (the same code runconsumer runs); the process-level
claims (kill -9, several workers) are in tests/processes/test_tasks.py. The backend is
configured by tests/tasks/conftest.py.
"""

from __future__ import annotations

import uuid

import pytest

from django_sqlqueue.exceptions import InvalidMessage
from django_sqlqueue.models import Message
from django_sqlqueue.tasks import enqueue_in_order, ordering_key
from django_sqlqueue.tasks.keys import current_key
from tests.support.task_helpers import finished, running_worker
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_ordering_key_runs_tasks_of_one_key_in_enqueue_order() -> None:
    with ordering_key("order:7"):
        results = [tasks.keyed.enqueue("keyed", "order:7", i) for i in range(20)]
    results.append(enqueue_in_order(tasks.keyed, "order:7", "keyed", "order:7", 20))
    keys = set(
        Message.objects.filter(topic="tasks.default", id__in=[r.id for r in results]).values_list("key", "partition")
    )
    assert len(keys) == 1 and next(iter(keys))[0] == "order:7"
    with running_worker(concurrency=4):
        for r in results:
            finished(r)
    assert list(Run.objects.filter(label="keyed").order_by("started", "id").values_list("seq", flat=True)) == list(
        range(21)
    )


def test_a_bad_ordering_key_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="empty"), ordering_key(""):
        pass


def test_ordering_key_blocks_nest_and_each_restores_the_key_around_it() -> None:
    assert current_key() == ""
    with ordering_key(7) as outer:
        assert outer == current_key() == "7"  # ints and UUIDs as text, like message keys
        with ordering_key(uuid.UUID(int=1)) as inner:
            assert inner == current_key() == "00000000-0000-0000-0000-000000000001"
        assert current_key() == "7"
        with pytest.raises(InvalidMessage), ordering_key(""):
            pass
        assert current_key() == "7"  # a refused key changes nothing
    assert current_key() == ""
    result = tasks.add.enqueue(1, 2)  # outside a block: no key
    assert Message.objects.get(id=result.id).key == ""
