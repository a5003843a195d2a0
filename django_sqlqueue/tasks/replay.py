"""Retrying a failed task from its dead letter (what the console's "retry" does for tasks).

A failed task is a dead letter of its topic (``tasks.<queue>_dlq``, id
``<group>:<result id>``). Retrying it, in one transaction:

1. deletes the dead letter (so a second failure can be dead-lettered again);
2. sets its result row back to READY (its earlier errors and attempts are kept);
3. publishes the task again to the original topic under a new message id
   ``<result id>:retry-<n>``, with ``result_id`` in the payload: the worker records the new
   attempts on the same TaskResult, so ``get_result(id)`` follows the retried task.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..conf import get_settings
from ..exceptions import InvalidMessage
from ..models import Message
from ..publisher import PublishedMessage, publish
from ..task_models import TaskResultRecord


def retry_dead_task(dead_letter: Message) -> PublishedMessage:
    """Re-enqueue the failed task held by ``dead_letter``; see the module docstring."""
    using = get_settings().DATABASE
    info: dict[str, Any] = (dead_letter.metadata or {}).get("dead_letter") or {}
    payload = dict(dead_letter.payload or {})
    if "task" not in payload or not dead_letter.original_topic:
        raise InvalidMessage(f"dead letter {dead_letter.id!r} of {dead_letter.topic!r} is not a failed task.")
    result_id = payload.get("result_id") or info.get("original_id") or dead_letter.id.split(":", 1)[-1]
    with transaction.atomic(using=using):
        deleted, _ = Message.objects.using(using).filter(pk=dead_letter.pk).delete()
        if not deleted:
            raise InvalidMessage(f"dead letter {dead_letter.id!r} was already retried or deleted.")
        record = TaskResultRecord.objects.using(using).select_for_update().filter(id=result_id).first()
        attempts = len(record.worker_ids) if record is not None else 0
        if record is not None:
            record.status = "READY"
            record.finished_at = None
            record.save(using=using, update_fields=["status", "finished_at", "updated_at"])
        return publish(
            dead_letter.original_topic,
            {**payload, "result_id": result_id},
            key=dead_letter.key,
            id=f"{result_id}:retry-{attempts}",
            metadata={"task": payload["task"], "retry_of": dead_letter.id},
            using=using,
        )


def is_task_payload(topic: str, payload: Any) -> bool:
    """Whether a message of ``topic`` with ``payload`` is a task of this backend."""
    return topic.startswith("tasks.") and isinstance(payload, dict) and "task" in payload


def prepare_replayed_task(payload: dict[str, Any], original_id: str, *, using: str) -> dict[str, Any]:
    """Make a replayed dead task report on its original result (the console's generic replay).

    The replay copy has a new message id; ``result_id`` in the payload makes the worker
    record the new attempts on the task's original ``TaskResult``, which is set back to
    READY here, in the caller's transaction (the one that deletes the dead letter).
    """
    result_id = payload.get("result_id") or original_id
    record = TaskResultRecord.objects.using(using).select_for_update().filter(id=result_id).first()
    if record is not None:
        record.status = "READY"
        record.finished_at = None
        record.save(using=using, update_fields=["status", "finished_at", "updated_at"])
    return {**payload, "result_id": result_id}
