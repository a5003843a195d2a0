"""Batches (django_sqlqueue/tasks/batches.py) under kill -9 of real ``runconsumer`` processes (slow).

Three workers run a batch's members while one of them is killed with SIGKILL every
second or so (and replaced): whatever instant a kill lands on -- mid-task, between a
task's end and its ack, mid-ack -- every member is counted exactly once and the callback
is enqueued exactly once, with the full counts. bench/batches.py measures the same at
1,000 members and 10 kills.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator

import pytest

from django_sqlqueue.task_models import TaskBatch, TaskResultRecord
from django_sqlqueue.tasks import batch
from django_sqlqueue.tasks.batches import callback_id
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.processes import ConsumerProcess
from tests.support.task_helpers import task_settings, wait_until
from tests.support.taskapp import batch_tasks as bt
from tests.support.taskapp.models import Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MEMBERS = 200
KILLS = 5
ENV = {"TSK_VISIBILITY_TIMEOUT": "2"}


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


def test_kill_9_of_workers_counts_every_member_once_and_fires_the_callback_once(
    runconsumer: Callable[..., ConsumerProcess],
) -> None:
    def start(name: str) -> ConsumerProcess:
        return runconsumer(name, "--group", "tasks", settings="tests.support.taskapp.process_settings", env=ENV)

    with batch(on_finish=bt.done, metadata={"seq": 1}) as b:
        for i in range(MEMBERS):
            bt.member.enqueue("member", seq=i, seconds=0.01)
    names = (f"bk{i}" for i in itertools.count())
    workers = [start(next(names)) for _ in range(3)]
    rng = random.Random(30)
    kills = 0
    while kills < KILLS:
        time.sleep(rng.uniform(0.5, 1.2))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.kill9()
        kills += 1
        workers.append(start(next(names)))
    wait_until(lambda: Run.objects.filter(key=b.id).exists(), 120, "the callback to run")
    row = TaskBatch.objects.get(id=b.id)
    assert (row.total, row.succeeded, row.failed) == (MEMBERS, MEMBERS, 0)
    # Enqueued (its id is the batch's, so at most one message can hold it) and run to the end.
    # Not read from queue_messages: the workers' collector (GC_INTERVAL 1, no retention)
    # deletes the callback's message as soon as the group acked it.
    assert row.callback_id == callback_id(b.id)
    callback = TaskResultRecord.objects.get(id=callback_id(b.id))
    assert callback.status == TaskResultStatus.SUCCESSFUL
    assert set(Run.objects.filter(key=b.id).values_list("label", flat=True)) == {f"done:{MEMBERS}:{MEMBERS}:0"}
    # Every member ran (some twice: killed before their ack), and each was counted once.
    assert set(Run.objects.filter(label="member").values_list("seq", flat=True)) == set(range(MEMBERS))
    assert kills == KILLS
    for worker in workers:
        assert worker.terminate() == 0, worker.log()[-3000:]
