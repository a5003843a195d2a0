"""Task timeouts: per queue (``OPTIONS["TIMEOUT"]``) and per task (:func:`task_timeout`).

A task runs as the handler of its queue's consumer, so it has that consumer's timeout
(``django_sqlqueue.worker.threads.watchdog``): by default the queue's visibility timeout,
``OPTIONS["TIMEOUT"]`` to choose one for every queue of the backend -- a number of
seconds, ``None`` for no limit, or a dict by queue name -- and :func:`task_timeout` for
one task::

    from django.tasks import task
    from django_sqlqueue.tasks import task_timeout

    @task
    @task_timeout(600)          # seconds; None: no limit
    def monthly_report(month): ...

A timed-out attempt is a failed attempt: its result gets an entry in ``errors`` whose
``exception_class_path`` is ``django_sqlqueue.exceptions.HandlerTimeout`` (a
``TimeoutError``), it is retried after the backoff and, on its last attempt, FAILED and
dead-lettered like any failure. The task's thread cannot be stopped (Python threads
cannot be killed): should the task finish after all, its late outcome is not recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from ..exceptions import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute :func:`task_timeout` sets on the task's function.
ATTRIBUTE = "_sqlqueue_timeout"


def task_timeout(seconds: float | None) -> Callable[[F], F]:
    """Give one task its own timeout (seconds; ``None``: no limit), over its queue's.

    Put it under ``@task`` (it marks the function ``@task`` wraps); on top of ``@task``
    it marks the task's function too.
    """
    if seconds is not None and (
        not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0 or math.isinf(seconds)
    ):
        raise ConfigurationError(f"task_timeout() takes a positive number of seconds or None, got {seconds!r}.")

    def mark(fn: F) -> F:
        target = getattr(fn, "func", fn)  # a django.tasks Task: mark the function it runs
        setattr(target, ATTRIBUTE, math.inf if seconds is None else float(seconds))
        return fn

    return mark


def timeout_of(task: Any) -> float | None:
    """The task's own timeout (``math.inf``: none), or None when it has none of its own."""
    value = getattr(getattr(task, "func", None), ATTRIBUTE, None)
    return value if isinstance(value, float) else None


def parse_timeout(where: str, value: Any) -> Any:
    """Validate ``OPTIONS["TIMEOUT"]``: a positive number, None, or a dict of those by queue name."""
    if isinstance(value, dict):
        for queue, seconds in value.items():
            _check(f"{where}[{queue!r}]", seconds)
        return dict(value)
    _check(where, value)
    return value


def _check(where: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
        raise ConfigurationError(
            f"{where} must be a positive number of seconds, None (no limit) or a dict of those by queue name, "
            f"got {value!r}."
        )
