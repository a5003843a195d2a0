"""``get_result()``: a task's state, read from its result row, its message or its dead letter.

A task's state lives in two places, and :func:`load_result` reads them in order:

1. its row in ``queue_task_results`` once a worker started it (status RUNNING, READY
   again while it waits for a retry, SUCCESSFUL or FAILED; attempts, errors with
   tracebacks and the return value);
2. before that, its message in the queue's topic (status READY, ``enqueued_at`` =
   the message's ``created_at``);
3. a task whose message went to the dead-letter topic without its row saying so (its
   worker died on every attempt: the visibility timeout expired ``MAX_ATTEMPTS`` times)
   is FAILED, with the dead letter's error.

Plain reads, no lock. What it needs of the backend is the :class:`TaskQueues` protocol.

The task a row or message names is looked up by the rule of ``trust.py``, as the worker
does: nothing outside the installed apps is imported, and a task the backend would not
run raises ``UntrustedTask`` (a ``TaskResult`` needs its ``Task``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Protocol

from ..conf import get_settings
from ..models import Message
from ..task_models import TaskResultRecord
from .compat import Task, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus, set_field
from .results import FINISHED, to_result
from .trust import at_level, message_task, queue_of_topic, trusted_task


class TaskQueues(Protocol):
    """What a result look-up needs of the backend: its alias, topics and dead-letter names."""

    @property
    def alias(self) -> str: ...

    def topics(self) -> dict[str, str]:
        """Queue name -> topic, for every queue of the backend."""
        ...

    def queue_levels(self) -> list[tuple[str, int, str]]:
        """(queue name, priority level, topic) for every queue and level (``priorities.py``)."""
        ...

    def dead_letter_topic(self, queue_name: str) -> str:
        """The dead-letter topic of ``queue_name``."""
        ...

    def dead_letter_id(self, result_id: str) -> str:
        """The id of the dead letter of the task ``result_id``."""
        ...


def load_result(backend: TaskQueues, result_id: str) -> TaskResult:
    """Return the state of task ``result_id`` (see the module docstring).

    Raise ``TaskResultDoesNotExist`` when neither a row, a message nor a dead letter has it,
    ``UntrustedTask`` when the task it names is not one the backend runs.
    """
    using = get_settings().DATABASE
    topics = backend.topics()
    record = TaskResultRecord.objects.using(using).filter(id=result_id, backend=backend.alias).first()
    if record is not None:
        # A row written before rows recorded their topic's queue may have none: its topic's.
        queue = record.queue_name or queue_of_topic(topics, record.topic) or ""
        task = trusted_task(record.task_path, alias=backend.alias, queues=topics.keys(), queue_name=queue)
        task = at_level(task, topics, record.topic) if record.topic else task
        result = to_result(record, task)
        if record.status not in FINISHED:
            dead = _dead_letter(backend, result_id, [queue])
            if dead is not None:
                _mark_dead(result, dead)
        return result
    message = (
        Message.objects.using(using)
        .filter(topic__in=[topic for _, _, topic in backend.queue_levels()], id=result_id)
        .only("payload", "created_at", "topic")
        .first()
    )
    if message is not None:
        return _from_message(backend, result_id, message.payload, message.topic, message.created_at)
    dead = _dead_letter(backend, result_id, list(topics))
    if dead is not None:
        result = _from_message(backend, result_id, dead.payload, dead.original_topic, dead.created_at)
        _mark_dead(result, dead)
        return result
    raise TaskResultDoesNotExist(result_id)


def _from_message(
    backend: TaskQueues, result_id: str, payload: dict[str, Any], topic: str, created: dt.datetime
) -> TaskResult:
    task: Task = message_task(backend.alias, backend.topics(), topic, payload)
    return TaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=created,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=backend.alias,
        errors=[],
        worker_ids=[],
    )


def _dead_letter(backend: TaskQueues, result_id: str, queue_names: list[str]) -> Message | None:
    # Each priority level's topic has its own dead-letter topic.
    conf = get_settings()
    wanted = set(queue_names)
    dead_topics = [conf.dlq_topic(topic) for name, _, topic in backend.queue_levels() if name in wanted]
    return (
        Message.objects.using(conf.DATABASE).filter(topic__in=dead_topics, id=backend.dead_letter_id(result_id)).first()
    )


def _mark_dead(result: TaskResult, dead: Message) -> None:
    set_field(result, "status", TaskResultStatus.FAILED)
    set_field(result, "finished_at", dead.failed_at)
    if not result.errors:
        first = (dead.last_error or "").split(":", 1)[0]
        result.errors.append(TaskError(exception_class_path=first or "builtins.Exception", traceback=dead.last_error))
