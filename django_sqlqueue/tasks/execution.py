"""Running a task message on a ``runconsumer`` worker.

The handler of a task topic: resolve the task, record the attempt (RUNNING), send
``task_started``, call the task (``async def`` tasks too), record the outcome and send
``task_finished`` once the outcome is final. A first attempt records RUNNING lazily
(``OPTIONS["MARK_RUNNING_AFTER"]``, ``tasks/marks.py``): its row is inserted RUNNING only
if it is still running after that threshold, else once with its outcome -- one statement
for a short task. Later attempts (they must read the row: a finished task is not run
again) and atomic queues record RUNNING as the attempt starts. The queue does the rest
with the usual consumer semantics:

- returning acks the message;
- raising nacks it: the task runs again after the backoff (``SQLQUEUE["BACKOFF_MIN"]``,
  ``BACKOFF_MAX``), until ``MAX_ATTEMPTS``; its result says READY with the error in
  ``errors`` meanwhile, then FAILED and the message goes to the dead-letter topic;
- ``django_sqlqueue.Retry(delay=...)`` retries after that delay, ``Reject`` fails at once;
- a task with fewer attempts of its own (``task_max_attempts``, ``attempts.py``) that
  fails its last one is FAILED with its error and dead-lettered at once: the handler
  raises ``TaskAttemptsExhausted`` (a ``Reject``) from the error. A delivery past the
  task's last attempt (that attempt timed out, or its worker died) is not run: FAILED
  and dead-lettered the same way;
- a message naming a task the backend does not run (``trust.py``) is never run: it is
  dead-lettered at once (``UntrustedTask``, a ``Reject``) and its result row says FAILED
  with the reason (:meth:`TaskHandler.refused`);
- a worker killed mid-task leaves the message delivered but not acked: another worker
  runs it again once the visibility timeout has passed (the result shows the attempt);
- a task that overruns its timeout (``tasks/timeouts.py``) is a failed attempt: the
  watchdog records the ``HandlerTimeout`` in its result (:meth:`TaskHandler.timed_out`)
  and the attempt is retried or dead-lettered; should the task return after all, its
  outcome is not recorded (``results.finish`` writes only over its own attempt).

**Atomic queues** (``OPTIONS["ATOMIC"]``, see ``atomic.py``): the task runs inside the
consumer's transaction, and its result row's final state (SUCCESSFUL, with the return
value) is written in that transaction too, so it commits with the task's effects and
the ack -- or not at all. The attempt is recorded RUNNING just *before* that
transaction (:meth:`TaskHandler.begin_attempt`, committed at once), so the open
transaction holds no lock on the result row while the task runs (the watchdog records
a timeout on that row). A task that raises rolls its transaction back; its failed attempt
is then recorded in a short transaction of its own (:meth:`TaskHandler.rolled_back`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..exceptions import Reject
from . import results
from .attempts import TaskAttemptsExhausted, attempts_for, exhausted
from .batches import BatchSettlement
from .compat import TaskContext, TaskResultStatus, normalize_json, task_finished, task_started
from .limits import limits_of
from .marks import marks
from .precheck import check_batch, may_have_row
from .timeouts import timeout_of
from .trust import MAX_PATH_LENGTH, UntrustedTask, message_task, queue_of_topic

if TYPE_CHECKING:
    from ..consumers import ReceivedMessage
    from ..rules.rates import Limits
    from .backend import SQLQueueBackend
    from .compat import Task

logger = logging.getLogger(__name__)

#: Recorded in ``worker_ids``: the worker process (as runconsumer's default subscriber name).
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


class TaskHandler:
    """The consumer handler of one task topic of one backend alias."""

    def __init__(self, alias: str, max_attempts: int) -> None:
        self.alias = alias
        #: The backend's attempts (its consumers'); a task may have fewer (``attempts.py``).
        self.max_attempts = max_attempts
        self.__name__ = f"run_tasks[{alias}]"
        self.__qualname__ = self.__name__
        #: Atomic queues: the attempt ``begin_attempt`` recorded on this thread, by message id
        #: (None: the task had finished already).
        self._begun = threading.local()
        #: Batch members are counted by the transaction that acks or dead-letters them, not
        #: here: a redelivered member that finished already counts with its ack (batches.py).
        self.settlement = BatchSettlement()
        #: This thread's last delivery and its task (``task_of``).
        self._resolved = threading.local()

    #: Called by the worker before a fetched batch runs (``worker/dispatch.py``): notes which
    #: tasks have a result row already, so a cancelled one is not run (``precheck.py``).
    before_batch = staticmethod(check_batch)

    def backend(self) -> SQLQueueBackend:
        from .compat import task_backends

        return task_backends[self.alias]  # type: ignore[return-value]

    def task_of(self, message: ReceivedMessage, backend: SQLQueueBackend | None = None) -> Task:
        """The task the message names, if this backend runs it; else raise ``UntrustedTask``
        saying why (the rule: ``trust.py``).

        Resolved once per delivery: the worker asks for the same ``ReceivedMessage`` up to
        four times (its limits, its timeout for the limiter and for the watchdog, the run),
        so this thread's last answer is kept for that object. A new delivery -- a retry too
        -- is a new object, resolved again. A refusal is not kept (it is raised every time).
        """
        last = getattr(self._resolved, "last", None)
        if last is not None and last[0] is message:
            return last[1]
        topics = (backend or self.backend()).topics()
        task = message_task(self.alias, topics, message.topic, message.payload)
        self._resolved.last = (message, task)
        return task

    def _task_or_none(self, payload: Any, topic: str | None = None) -> Task | None:
        """The task of a message that ran already (for a signal), or None. Without
        ``topic``: the topic of the payload's queue, which ``task_of`` found to be its own."""
        try:
            backend = self.backend()
            queue_topic = topic if topic is not None else backend.topic_for(payload["queue_name"])
            return message_task(self.alias, backend.topics(), queue_topic, payload)
        except Exception:  # noqa: BLE001 - the result is recorded; only the signal needs the task
            return None

    def timeout_for(self, message: ReceivedMessage) -> float | None:
        """The task's own timeout (``task_timeout``), or None: its queue's."""
        try:
            task = self.task_of(message)
        except Exception:  # noqa: BLE001 - the handler refuses it with the reason
            return None
        return timeout_of(task)

    def limits_for(self, message: ReceivedMessage) -> Limits | None:
        """The task's rate and concurrency limits for this message (``limits.py``); None: none."""
        try:
            task = self.task_of(message)
            return limits_of(task, message.payload.get("args", []), message.payload.get("kwargs", {}))
        except Exception:  # noqa: BLE001 - the handler refuses it with the reason
            return None

    def timed_out(self, message_id: str, payload: Any, attempt: int, error: BaseException, final: bool) -> None:
        """The watchdog gave the task's attempt up: record the timeout in its result."""
        result_id = (payload.get("result_id") if isinstance(payload, dict) else None) or message_id
        # A lazy attempt's row may not be written yet: write it RUNNING, then record the
        # timeout over it (marks.py orders this write against the handler's own).
        marks.write_now(result_id)
        record = results.time_out(result_id, error=error, final=final)
        if record is not None and final:
            task = self._task_or_none(payload)
            if task is not None:
                task_finished.send(type(self.backend()), task_result=results.to_result(record, task))

    def begin_attempt(self, message: ReceivedMessage) -> None:
        """Atomic queues: record the attempt RUNNING before the consumer's transaction begins."""
        try:
            self.task_of(message)  # a refused task: no RUNNING row (rolled_back records the refusal)
            record = self._begin(message)
        except Exception:  # noqa: BLE001 - __call__ records the attempt (or rejects the task) itself
            self._begun.entry = None
            return
        self._begun.entry = (message.id, message.attempt, record)

    def rolled_back(self, message: ReceivedMessage, error: BaseException, final: bool) -> None:
        """Atomic queues: the task raised and its transaction rolled back: record the failed attempt."""
        if isinstance(error, UntrustedTask):
            self._taken(message)
            self.refused(message, error)
            return
        if isinstance(error, TaskAttemptsExhausted) and error.__cause__ is not None:
            error = error.__cause__  # the task's own error, not the means of dead-lettering it
        record = self._taken(message) or self._begin(message)
        if record is None:
            return
        if results.finish(record, error=error, final=final) and final:
            task = self._task_or_none(message.payload, message.topic)
            if task is not None:
                task_finished.send(type(self.backend()), task_result=results.to_result(record, task))

    def refused(self, message: ReceivedMessage, error: UntrustedTask) -> None:
        """Record a refused task message: its result row FAILED with ``error`` (never run).

        Best effort: the message is dead-lettered with the reason whatever happens here.
        No ``task_finished``: it needs the ``Task``, which was not looked up. A payload that
        is not an object names no task: no row.
        """
        payload = message.payload
        if not isinstance(payload, dict):
            return
        path = payload.get("task")
        shown = (path if isinstance(path, str) else repr(path))[:MAX_PATH_LENGTH]
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        result_id = payload.get("result_id") or message.id
        if not isinstance(result_id, str):
            result_id = message.id
        try:
            results.record_refusal(
                backend_alias=self.alias,
                result_id=result_id,
                replayed=result_id != message.id,
                payload={
                    "task": shown,
                    "args": args if isinstance(args, list) else [],
                    "kwargs": kwargs if isinstance(kwargs, dict) else {},
                    "queue_name": queue_of_topic(self.backend().topics(), message.topic) or "",
                },
                topic=message.topic,
                key=message.key,
                enqueued_at=message.created_at,
                worker_id=WORKER_ID,
                attempt=message.attempt,
                error=error,
            )
        except Exception:  # the dead letter says why; the row is a convenience
            logger.exception("could not record a refused task's result id=%s topic=%s", message.id, message.topic)

    def _taken(self, message: ReceivedMessage, *, keep: bool = False) -> Any:
        """The record ``begin_attempt`` made for this delivery (False: the task had finished;
        None: none). ``keep``: leave it for ``rolled_back``."""
        entry = getattr(self._begun, "entry", None)
        if not keep:
            self._begun.entry = None
        if entry is None or entry[:2] != (message.id, message.attempt):
            return None
        return entry[2] or False

    def _begin(self, message: ReceivedMessage, *, lazy: bool = False, backend: SQLQueueBackend | None = None) -> Any:
        payload = message.payload
        # The row's queue is the topic's (task_of checked that a queue_name in the payload
        # says the same; a message written without one, by a backfill, gets it here).
        queue = queue_of_topic((backend or self.backend()).topics(), message.topic)
        if queue is not None and payload.get("queue_name") != queue:
            payload = {**payload, "queue_name": queue}
        # A task retried from its dead letter carries its TaskResult id (tasks/replay.py).
        result_id = payload.get("result_id") or message.id
        replayed = result_id != message.id
        return results.begin(
            backend_alias=self.alias,
            result_id=result_id,
            payload=payload,
            topic=message.topic,
            key=message.key,
            enqueued_at=message.created_at,
            worker_id=WORKER_ID,
            first_attempt=message.attempt == 1 and not replayed,
            earlier_attempts=0 if replayed else message.attempt - 1,
            lazy=lazy,
        )

    def __call__(self, message: ReceivedMessage) -> None:
        backend = self.backend()
        payload = message.payload
        try:
            task = self.task_of(message, backend)
        except UntrustedTask as exc:
            # Dead-lettered at once (a Reject). In an atomic consumer's transaction the row is
            # written after its rollback (rolled_back), not here.
            if not message._atomic:
                self.refused(message, exc)
            raise
        if tracing.ENABLED:  # the worker's process span names the task
            tracing.set_current_attributes({tracing.TASK_NAME: task.module_path})
        # In an atomic consumer's transaction (atomic.py): the attempt was begun before it,
        # and a failure is recorded after its rollback (rolled_back), not here.
        # Asked of the delivery, not of the connection: under a test's transaction
        # (django_sqlqueue.testing.drain) every consumer runs inside an atomic block.
        atomic = message._atomic
        begun = self._taken(message, keep=True) if atomic else None
        result_id = payload.get("result_id") or message.id
        if begun is False:
            logger.info("task already finished, not run again id=%s task=%s", message.id, payload["task"])
            return
        mark_after = backend.sqlqueue.mark_running_after
        # A task with a row (cancelled?) takes the locked path of begin (tasks/precheck.py).
        lazy = not atomic and mark_after > 0 and not may_have_row(result_id)
        record = begun if begun is not None else self._begin(message, lazy=lazy, backend=backend)
        if record is None:
            logger.info("task already finished, not run again id=%s task=%s", message.id, payload["task"])
            return
        limit = attempts_for(task, self.max_attempts)
        if message.attempt > limit:
            # The task's last attempt ended without an outcome (it timed out, or its worker
            # died); the consumer, counting to the backend's attempts, delivered it again.
            gone = exhausted(task, message.attempt, limit, None)
            if not atomic and results.finish(record, error=gone, final=True):
                task_finished.send(type(backend), task_result=results.to_result(record, task))
            raise gone
        task_result = results.to_result(record, task)
        # A lazy first attempt: its row is written RUNNING only if it runs past mark_after.
        mark = None if results.is_written(record) else marks.start(record, mark_after)
        task_started.send(type(backend), task_result=task_result)
        try:
            try:
                if task.takes_context:
                    value = task.call(TaskContext(task_result=task_result), *record.args, **record.kwargs)
                else:
                    value = task.call(*record.args, **record.kwargs)
            finally:
                if mark is not None:
                    marks.settle(mark)  # before the final write: see marks.py, "Ordering"
            value = normalize_json(value)
            json.dumps(value)  # a return value the result row cannot store fails the attempt
        except Exception as exc:
            # The task's own last attempt, before the consumer's: dead-letter it now.
            ends_early = not isinstance(exc, Reject) and message.attempt >= limit and limit < self.max_attempts
            if not atomic:  # else rolled back: rolled_back() records it
                final = ends_early or isinstance(exc, Reject) or message.attempt >= limit
                if results.finish(record, error=exc, final=final) and final:
                    task_finished.send(type(backend), task_result=results.to_result(record, task))
            if ends_early:
                raise exhausted(task, message.attempt, limit, exc) from exc
            raise
        if not results.finish(record, value=value, final=True):
            logger.info("a timed-out task returned after all; its outcome is not recorded id=%s", result_id)
            return
        done = results.to_result(record, task)
        assert done.status == TaskResultStatus.SUCCESSFUL
        task_finished.send(type(backend), task_result=done)


_handlers: dict[str, TaskHandler] = {}


def handler_for(alias: str, max_attempts: int) -> TaskHandler:
    """One handler per alias (the consumer registry refuses two handlers for one topic),
    with the attempts of the latest specs (settings may change: tests, a reload)."""
    handler = _handlers.setdefault(alias, TaskHandler(alias, max_attempts))
    handler.max_attempts = max_attempts
    return handler
