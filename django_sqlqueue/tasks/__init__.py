"""A ``django.tasks`` backend on the queue: tasks are messages of a tasks topic.

::

    TASKS = {
        "default": {
            "BACKEND": "django_sqlqueue.tasks.SQLQueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3},
        }
    }

``enqueue()`` publishes the task in the caller's transaction; ``manage.py runconsumer``
runs it. See docs/tasks.md. Names are imported lazily so that importing this package
does not need ``django.tasks`` until the backend is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attempts import TaskAttemptsExhausted, task_max_attempts  # noqa: F401
    from .backend import SQLQueueBackend  # noqa: F401
    from .batch_members import Batch, BatchError  # noqa: F401
    from .batches import batch, enqueue_batch  # noqa: F401
    from .cancellation import CancelOutcome, UnknownTask, cancel, cancel_requested  # noqa: F401
    from .keys import enqueue_in_order, ordering_key  # noqa: F401
    from .limits import concurrency_limit, rate_limit  # noqa: F401
    from .options import TaskBackendMisconfigured  # noqa: F401
    from .timeouts import task_timeout  # noqa: F401
    from .trust import UntrustedTask  # noqa: F401
    from .uniqueness import UniqueTaskContention, unique  # noqa: F401

_EXPORTS = {
    "SQLQueueBackend": "backend",
    "ordering_key": "keys",
    "enqueue_in_order": "keys",
    "task_timeout": "timeouts",
    "task_max_attempts": "attempts",
    "TaskAttemptsExhausted": "attempts",
    "TaskBackendMisconfigured": "options",
    "UntrustedTask": "trust",
    "batch": "batches",
    "enqueue_batch": "batches",
    "Batch": "batch_members",
    "BatchError": "batch_members",
    "rate_limit": "limits",
    "concurrency_limit": "limits",
    "unique": "uniqueness",
    "UniqueTaskContention": "uniqueness",
    "cancel": "cancellation",
    "cancel_requested": "cancellation",
    "CancelOutcome": "cancellation",
    "UnknownTask": "cancellation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue.tasks' has no attribute {name!r}")
    if name == "SQLQueueBackend":
        from .app_missing import AppMissingBackend, app_missing

        if app_missing():  # the real one cannot be imported: a check error instead (not cached)
            return AppMissingBackend
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
