"""Ordering keys for tasks: tasks enqueued with the same key run in enqueue order.

``django.tasks`` has no place for a key, so it is given around the ``enqueue()`` call::

    from django_sqlqueue.tasks import ordering_key, enqueue_in_order

    with ordering_key(f"order:{order.pk}"):
        charge.enqueue(order.pk)
        send_receipt.enqueue(order.pk)

    enqueue_in_order(ship, f"order:{order.pk}", order.pk)   # the same, for one call

The key becomes the message key: tasks with one key go to one partition of the queue's
topic and start in enqueue order (a task that fails and waits for its retry does not
hold back the next one unless the backend runs strictly, ``OPTIONS["STRICT"]``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..exceptions import InvalidMessage
from ..rules.validation import validate_key

_current: contextvars.ContextVar[str] = contextvars.ContextVar("sqlqueue_task_key", default="")


@contextmanager
def ordering_key(key: Any) -> Iterator[str]:
    """Enqueue the tasks of the block with ordering key ``key`` (str, int or UUID)."""
    text = _as_key(key)
    token = _current.set(text)
    try:
        yield text
    finally:
        _current.reset(token)


def current_key() -> str:
    """The ordering key of the enclosing :func:`ordering_key` block ("" outside one)."""
    return _current.get()


def enqueue_in_order(task: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
    """``task.enqueue(*args, **kwargs)`` with ordering key ``key``; returns the TaskResult."""
    with ordering_key(key):
        return task.enqueue(*args, **kwargs)


def _as_key(key: Any) -> str:
    text = validate_key(key)
    if not text:
        raise InvalidMessage("an ordering key must not be empty (leave the block out for no key).")
    return text
