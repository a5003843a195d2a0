"""Which batch a task joins as it is enqueued (``tasks/batches.py`` makes batches).

Apart from ``batches.py`` so that the backend's ``enqueue`` can ask it without an import
cycle: a plain enqueue pays one ``ContextVar.get()`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import SQLQueueError

#: The payload key naming a member's batch.
BATCH_KEY = "batch"
#: The keyword arguments the callback receives.
CALLBACK_KWARGS = ("batch_id", "total", "succeeded", "failed", "metadata")


class BatchError(SQLQueueError, ValueError):
    """A batch cannot be made as asked (its callback, its metadata, a member); nothing is written."""


@dataclass
class Batch:
    """A batch being enqueued (inside its block) or enqueued (after it)."""

    id: str
    #: The backend alias of the callback and of every member.
    backend: str
    #: The callback task's module path.
    on_finish: str
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Members enqueued so far; final once the block has closed.
    total: int = 0


current: ContextVar[Batch | None] = ContextVar("sqlqueue_task_batch", default=None)


def batch_fields(alias: str) -> dict[str, str]:
    """The payload fields of a task enqueued now on backend ``alias``: ``{"batch": id}`` inside
    a :func:`batch` block, else nothing (the backend's ``enqueue`` calls it)."""
    opened = current.get()
    if opened is None:
        return {}
    if opened.backend != alias:
        raise BatchError(
            f"a task of backend {alias!r} was enqueued inside a batch of backend {opened.backend!r}: "
            "a batch's members and its callback must use the same backend."
        )
    return {BATCH_KEY: opened.id}


def joined(payload: Mapping[str, Any]) -> None:
    """A task was enqueued with ``payload`` (after :func:`batch_fields`): count it in its batch."""
    opened = current.get()
    if opened is not None and payload.get(BATCH_KEY) == opened.id:
        opened.total += 1
