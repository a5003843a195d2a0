"""Exceptions raised by django-sqlqueue.

Every error the library raises on purpose derives from :class:`SQLQueueError`, so
callers can catch the whole family with one ``except`` clause.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class SQLQueueError(Exception):
    """Base class of every django-sqlqueue error."""


class InvalidMessage(SQLQueueError, ValueError):
    """A message given to ``publish()``/``publish_many()`` is malformed.

    Raised before anything is written: no row of the batch is stored.
    """


class PayloadTooLarge(InvalidMessage):
    """The serialized payload exceeds ``SQLQUEUE["MAX_PAYLOAD_BYTES"]``."""


class ConfigurationError(SQLQueueError, ImproperlyConfigured):
    """The ``SQLQUEUE`` setting is invalid."""


class NotInstalled(SQLQueueError, ImproperlyConfigured):
    """``django_sqlqueue`` is not in ``INSTALLED_APPS``: its models cannot load and its tables
    were never migrated (raised when ``publish()`` is imported or meets the missing tables)."""


class QueueTablesMissing(SQLQueueError, ImproperlyConfigured):
    """The queue's tables do not exist on the database ``publish()`` writes to: its
    migrations were not run there (``manage.py migrate django_sqlqueue --database <alias>``)."""


class UnsupportedDatabase(SQLQueueError):
    """The database vendor of the queue connection is not supported."""


class Retry(SQLQueueError):
    """Raise in a handler to nack the message and retry it after ``delay`` seconds.

    Without ``delay`` the worker's exponential backoff applies. The attempt still
    counts towards ``max_attempts``.
    """

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        if delay is not None and not (isinstance(delay, (int, float)) and delay >= 0):
            raise ValueError(f"Retry delay must be a number of seconds >= 0, got {delay!r}.")
        super().__init__(reason or "retry requested")
        self.delay = None if delay is None else float(delay)


class Reject(SQLQueueError):
    """Raise in a handler to dead-letter the message at once (a poison message)."""


class IdempotencyConflict(InvalidMessage):
    """A message id was published again with a different payload or key.

    Nothing of the call is written. Publishing an id again with the same payload is
    fine: it stores nothing and reports ``created=False``.
    """


class OutboxWarning(UserWarning):
    """``publish()`` cannot join the caller's transaction (it is on another alias)."""


class WorkerCrashed(SQLQueueError):
    """A worker stopped because one of its side threads (lease keeper, scheduler) died.

    The worker hands back what it can (in-flight messages, leases) and ``runconsumer``
    exits with a non-zero status, so a process manager restarts it: a worker without its
    lease keeper would poll on with leases nobody renews.
    """


class HandlerTimeout(SQLQueueError, TimeoutError):
    """A handler ran longer than its consumer's ``timeout`` without progress.

    Recorded as the error of the failed attempt (the message is retried, and
    dead-lettered on its last attempt); an ``async def`` handler is cancelled with it.
    See :mod:`django_sqlqueue.worker.threads.watchdog`.
    """


class HandlersStuck(WorkerCrashed):
    """More handler threads are stuck in handlers that overran their timeout than
    ``--concurrency``: the worker exits for a restart (a Python thread cannot be killed)."""


class FenceLost(SQLQueueError):
    """An atomic consumer's transaction could not write its ack: this worker no longer
    holds the partition's lease, or the delivery is no longer the one it was given (the
    message was redelivered, nacked or acked elsewhere meanwhile).

    The transaction is rolled back -- the handler's effects vanish with it -- and the
    message is left to the partition's current holder. See :mod:`django_sqlqueue.worker.batch.atomic`.
    """


class TestingError(SQLQueueError):
    """A helper of :mod:`django_sqlqueue.testing` was used where it cannot work (an assertion
    without a capture, ``drain()`` on a database it cannot consume from, an unknown consumer)."""

    __test__ = False  # not a test class, whatever pytest's name patterns say


class TaskCancelled(SQLQueueError):
    """A task was cancelled before it ran (``django_sqlqueue.tasks.cancel``).

    Never raised by the worker: its dotted path is the ``exception_class_path`` of the
    cancelled task's last ``errors`` entry (the result is FAILED: Django's
    ``TaskResultStatus`` has no cancelled state), whose ``traceback`` says who cancelled
    it and when. See :mod:`django_sqlqueue.ops.task_cancel`.
    """
