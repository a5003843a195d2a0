"""Fixtures of the django.tasks backend tests (tests/tasks).

``_tasks_configured`` (autouse) configures the backend (tests/support/task_helpers.py);
test_timeouts.py replaces it with its own of the same name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_sqlqueue.tasks.compat import task_enqueued, task_finished, task_started
from tests.support.task_helpers import task_settings


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    from django_sqlqueue.tasks.marks import marks

    with task_settings():
        yield
    # The running-marks thread's connection: closed before the test database is dropped.
    assert marks.close_connections()


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any]]]:
    """The task signals sent during the test: (name, task_result) in order."""
    received: list[tuple[str, Any]] = []
    handlers = {
        "enqueued": lambda sender, task_result, **kw: received.append(("enqueued", task_result)),
        "started": lambda sender, task_result, **kw: received.append(("started", task_result)),
        "finished": lambda sender, task_result, **kw: received.append(("finished", task_result)),
    }
    task_enqueued.connect(handlers["enqueued"], weak=False)
    task_started.connect(handlers["started"], weak=False)
    task_finished.connect(handlers["finished"], weak=False)
    yield received
    task_enqueued.disconnect(handlers["enqueued"])
    task_started.disconnect(handlers["started"])
    task_finished.disconnect(handlers["finished"])
