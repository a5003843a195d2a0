"""Task priorities with a real runconsumer process (slow): a higher priority enqueued behind
a running backlog starts within a batch or two of it (tasks/priorities.py, worker/bands.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
from django.db import transaction
from django.test import override_settings

from tests.support.processes import ConsumerProcess
from tests.support.task_helpers import task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.models import Run
from tests.support.taskapp.settings_common import TASKS

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEVELS = "-10,0,50"


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    configured = copy.deepcopy(TASKS)
    configured["default"]["OPTIONS"]["PRIORITIES"] = [int(p) for p in LEVELS.split(",")]
    with task_settings(), override_settings(TASKS=configured):
        yield


def test_a_worker_starts_higher_priority_tasks_before_its_backlog(
    runconsumer: Callable[..., ConsumerProcess],
) -> None:
    with transaction.atomic():
        for i in range(400):
            tasks.keyed.using(priority=-10).enqueue("low", "", i)
    runconsumer(
        "tsk-prio", "--concurrency", "1", settings="tests.support.taskapp.process_settings",
        env={"TSK_PRIORITIES": LEVELS},
    )  # fmt: skip
    wait_until(lambda: Run.objects.filter(label="low").count() >= 50, 60, "the backlog to start", 0.02)
    with transaction.atomic():
        for i in range(10):
            tasks.keyed.using(priority=50).enqueue("high", "", i)
        plain = tasks.keyed.enqueue("plain", "", 0)
    seen = Run.objects.filter(label="low").count()
    wait_until(lambda: Run.objects.filter(label="plain").exists(), 60, "the high and plain tasks to run", 0.02)
    last_high = max(Run.objects.filter(label="high").values_list("started", flat=True))
    plain_started = Run.objects.get(label="plain").started
    assert Run.objects.filter(label="high").count() == 10 and plain_started > last_high  # 50 before 0
    # Started after the commit and before the last high one: what the poll in progress had
    # fetched (one batch of 10 per partition with work: at most 80), under issue 30's aim of 100.
    between = Run.objects.filter(label="low", started__lt=last_high).count() - seen
    assert between < 100, between
    assert plain.id  # the default level is a level like the others
