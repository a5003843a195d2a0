"""Replaying a failed task from its dead letter: the tasks backend's replay hook.

A failed task is a dead letter of its topic (``<topic><DLQ_SUFFIX>``, id
``<group>:<result id>``). The generic replay (``ops`` replay: the console, ``manage.py
queue_dlq replay``) appends a copy of the dead letter to the task's topic under a new
message id, in one transaction with deleting the dead letter. For a task it calls
:func:`replay_task` (a ``dlq`` replay hook, registered by ``apps.py`` when ``TASKS``
names this backend, and by the backend itself), which, in that transaction:

1. sets the task's result row back to READY (its earlier errors and attempts are kept);
2. puts ``result_id`` in the copy's payload: the worker records the new attempts on the
   same TaskResult, so ``get_result(id)`` follows the retried task.

This module imports neither ``django.tasks`` nor the backport: ``apps.py`` imports it in
every process where the backend is configured, including those that never use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_task_message(payload: Any, metadata: Any) -> bool:
    """Return True when a message is a task of this backend.

    Recognised by the backend's own marker -- ``enqueue`` publishes the task's path both
    in the payload and as ``metadata["task"]``, which a dead letter and a replayed copy
    keep -- not by its topic: ``OPTIONS["TOPIC_PREFIX"]`` makes task topics any name.
    """
    if not isinstance(payload, dict) or not isinstance(metadata, Mapping):
        return False
    path = metadata.get("task")
    return isinstance(path, str) and payload.get("task") == path


def replay_task(topic: str, payload: Any, metadata: Mapping[str, Any], original_id: str, using: str) -> Any:
    """The replay hook (``dlq.ReplayHook``): make a replayed task report on its original result.

    Return ``payload`` unchanged for a message that is not a task.
    """
    if not is_task_message(payload, metadata):
        return payload
    return prepare_replayed_task(payload, original_id, using=using)


def prepare_replayed_task(payload: dict[str, Any], original_id: str, *, using: str) -> dict[str, Any]:
    """Set the task's result row back to READY and return the copy's payload, with ``result_id``.

    The replay copy has a new message id; ``result_id`` in the payload makes the worker
    record the new attempts on the task's original ``TaskResult``. The row is locked and
    updated in the caller's transaction (the one that deletes the dead letter), so a
    replay that rolls back leaves it FAILED.
    """
    from . import results  # the django.tasks types it needs load only when a replay runs

    result_id = payload.get("result_id") or original_id
    results.reset_for_replay(result_id, using=using)
    return {**payload, "result_id": result_id}
