"""Per-task attempts: :func:`task_max_attempts`, below the backend's ``MAX_ATTEMPTS``.

Where a task's retries are configured, from the widest to the narrowest (docs/tasks.md,
"Retries"):

1. ``SQLQUEUE["MAX_ATTEMPTS"]``: every consumer's attempts, task queues included, unless
2. ``TASKS[alias]["OPTIONS"]["MAX_ATTEMPTS"]`` sets those of the backend's task queues;
3. :func:`task_max_attempts` lowers them for one task::

       from django.tasks import task
       from django_sqlqueue.tasks import task_max_attempts

       @task
       @task_max_attempts(2)       # its 2nd failed attempt is its last: dead-lettered
       def charge_card(order_id): ...

The delay between attempts is the queue's backoff (``SQLQUEUE["BACKOFF_MIN"]``,
``BACKOFF_MAX``) or the delay of a ``Retry(delay=...)`` the task raises.

A task's attempts cannot exceed its backend's: the worker's consumer of the queue
dead-letters a message after the backend's attempts whatever the task says, so
``enqueue()`` (and ``@task``, when ``task_max_attempts`` sits under it) refuses a task
asking for more with ``InvalidTask``. The handler (``execution.py``) ends a task on its
own last attempt by raising :class:`TaskAttemptsExhausted` (a ``Reject``: dead-lettered
at once) from the task's error; the task's result records that error, FAILED.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..exceptions import ConfigurationError, Reject

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute :func:`task_max_attempts` sets on the task's function.
ATTRIBUTE = "_sqlqueue_max_attempts"
#: The most attempts a task may ask for (a guard against a misplaced number, such as seconds).
MAX_TASK_ATTEMPTS = 1000


class TaskAttemptsExhausted(Reject):
    """A task failed its own last attempt (``task_max_attempts``): dead-letter its message now.

    Raised by the worker from the task's error (``__cause__``), which the task's result records.
    """


def task_max_attempts(attempts: int) -> Callable[[F], F]:
    """Give one task at most ``attempts`` attempts (1 = no retry), fewer than its queue's.

    Put it under ``@task`` (it marks the function ``@task`` wraps; then ``@task`` checks
    it against the backend's attempts at once); on top of ``@task`` it marks the task's
    function too, checked at ``enqueue()``.
    """
    if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= MAX_TASK_ATTEMPTS:
        raise ConfigurationError(
            f"task_max_attempts() takes a whole number of attempts from 1 to {MAX_TASK_ATTEMPTS}, got {attempts!r}."
        )

    def mark(fn: F) -> F:
        target = getattr(fn, "func", fn)  # a django.tasks Task: mark the function it runs
        setattr(target, ATTRIBUTE, attempts)
        return fn

    return mark


def max_attempts_of(task: Any) -> int | None:
    """The task's own attempts (``task_max_attempts``), or None when it has none of its own."""
    func = getattr(task, "func", task)
    value = getattr(func, ATTRIBUTE, None)
    return value if isinstance(value, int) else None


def attempts_for(task: Any, backend_attempts: int) -> int:
    """The attempts of ``task`` on a backend allowing ``backend_attempts``: its own if fewer."""
    own = max_attempts_of(task)
    return backend_attempts if own is None else min(own, backend_attempts)


def exhausted(task: Any, attempt: int, limit: int, error: BaseException | None) -> TaskAttemptsExhausted:
    """The ``Reject`` that dead-letters a task after its own last attempt (``error``: that attempt's)."""
    what = f"{type(error).__qualname__}: {error}" if error is not None else "its last attempt did not finish"
    return TaskAttemptsExhausted(
        f"task {task.module_path} used its {limit} attempt(s) (task_max_attempts), attempt {attempt}: {what}"
    )
