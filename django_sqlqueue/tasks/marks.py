"""Lazy RUNNING: a task's row is written RUNNING only once it has run for a while.

A task's first attempt writes nothing when it starts (``OPTIONS["MARK_RUNNING_AFTER"]``,
default :data:`DEFAULT_MARK_RUNNING_AFTER` seconds; 0 turns this off). The handler hands
its unsaved row to :class:`RunningMarks` and runs the task; the marks' thread inserts
the row RUNNING if the task is still running once the threshold has passed. Most tasks
finish before: :meth:`RunningMarks.settle` takes the row back unwritten and the handler
inserts it once, in its final state (``results.finish``) -- one statement per task
instead of a commit at each end.

**Ordering.** A row is written by one thread at a time: the marks' thread writes it
only while the task runs, and :meth:`RunningMarks.settle` (the handler, after the task)
waits for a write in progress to end before it returns, so the handler's final write
always comes after the RUNNING insert and knows whether there was one (``results.is_written``).
The watchdog giving the attempt up (``TaskHandler.timed_out``) calls
:meth:`RunningMarks.write_now` first, so the timeout is recorded over a RUNNING row.

**What a reader sees.** ``get_result()`` says READY (from the message) during the first
``MARK_RUNNING_AFTER`` of a first attempt, RUNNING after that; ``started_at`` is the
attempt's real start either way. A worker killed within that window leaves no row: the
next attempt's row counts the lost attempt in ``worker_ids`` (``results.UNRECORDED_WORKER``).

**Connections.** The thread opens its own connection to the queue's database on its
first write (only a process that runs a task longer than the threshold ever does), keeps
it while tasks keep needing their mark, and closes it after :data:`IDLE_CLOSE` seconds
with none.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass

from ..db.conn import close_all_quietly, tidy_connections
from ..task_models import TaskResultRecord
from . import results

logger = logging.getLogger(__name__)

#: Seconds a task's first attempt runs before its row is written RUNNING (by default).
DEFAULT_MARK_RUNNING_AFTER = 0.1
#: Seconds without a mark to write after which the thread closes its connection.
IDLE_CLOSE = 5.0


@dataclass(eq=False)
class Mark:
    """One running attempt whose row is not written yet."""

    record: TaskResultRecord
    #: ``time.monotonic()`` at which the row is written RUNNING if the task still runs.
    due: float
    #: Being written by some thread (the others wait for it).
    writing: bool = False
    #: The task ended (settled): nobody writes the row RUNNING any more.
    settled: bool = False


class RunningMarks:
    """The attempts of this process waiting for their RUNNING row; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: A heap by due time (backends may have different thresholds): (due, serial, mark).
        self._queue: list[tuple[float, int, Mark]] = []
        self._serial = itertools.count()
        #: Result id -> its mark, for the watchdog (``write_now``).
        self._by_id: dict[str, Mark] = {}
        self._thread: threading.Thread | None = None
        #: The thread has written since it last closed its connections.
        self._connected = False
        #: ``close_connections()`` waits for the thread to close them.
        self._close_requested = False
        #: When the last write ended.
        self._idle_since = 0.0

    def start(self, record: TaskResultRecord, after: float) -> Mark:
        """A task starts with its row unwritten: write it RUNNING after ``after`` seconds."""
        mark = Mark(record, time.monotonic() + after)
        with self._cond:
            self._by_id[record.id] = mark
            heapq.heappush(self._queue, (mark.due, next(self._serial), mark))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sqlqueue-task-marks", daemon=True)
                self._thread.start()
            elif self._queue[0][2] is mark:
                # Due before any other (or the only one): the thread sleeps until the
                # previous first one's due, or without a deadline -- wake it.
                self._cond.notify()
        return mark

    def settle(self, mark: Mark) -> bool:
        """The task ended: nobody writes its row RUNNING from now on. Wait for a write in
        progress; True if the row was written (the final write updates it, else inserts it)."""
        with self._cond:
            while mark.writing:
                self._cond.wait()
            mark.settled = True
            if self._by_id.get(mark.record.id) is mark:
                del self._by_id[mark.record.id]
        return results.is_written(mark.record)

    def write_now(self, result_id: str) -> None:
        """Write the row of a running attempt RUNNING now if it is not yet (the watchdog is
        about to record its timeout over it). Nothing if no unsettled mark has that id."""
        with self._cond:
            mark = self._by_id.get(result_id)
            if mark is None:
                return
            while mark.writing:
                self._cond.wait()
            if mark.settled or results.is_written(mark.record):
                return
            mark.writing = True
        self._write(mark)

    def close_connections(self, timeout: float = 5.0) -> bool:
        """Have the thread close its connections now if it has no mark to write (a test
        that drops its database); True once closed or if it had none."""
        with self._cond:
            if not self._connected or self._thread is None or not self._thread.is_alive():
                return True
            self._close_requested = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._close_requested, timeout)

    def pending(self) -> int:
        """Attempts of this process whose row is not written yet."""
        with self._cond:
            return sum(1 for m in self._by_id.values() if not results.is_written(m.record))

    def _write(self, mark: Mark) -> None:
        """Insert the row RUNNING (``mark.writing`` is set by the caller, cleared here)."""
        try:
            if not results.insert(mark.record):
                # A row with this id exists (an id enqueued again after its message was
                # garbage-collected): the final write finds it and keeps it.
                logger.warning("a task's result row exists already; not marked RUNNING id=%s", mark.record.id)
        except Exception:  # the final write records the attempt all the same
            logger.exception("could not write a running task's row id=%s", mark.record.id)
        finally:
            tidy_connections()
            with self._cond:
                self._connected = True
                self._idle_since = time.monotonic()
                mark.writing = False
                self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                self._write(self._next_due())
        finally:  # (a daemon thread: it ends with the process)
            close_all_quietly()

    def _next_due(self) -> Mark:
        """Wait for the first unsettled mark to be due; return it flagged ``writing``."""
        with self._cond:
            while True:
                while self._queue and _not_for_the_thread(self._queue[0][2]):
                    heapq.heappop(self._queue)
                if not self._queue:
                    if self._connected:
                        idle_for = time.monotonic() - self._idle_since
                        if not self._close_requested and idle_for < IDLE_CLOSE:
                            self._cond.wait(IDLE_CLOSE - idle_for)
                            continue
                        close_all_quietly()  # idle: a worker of short tasks needs no connection here
                        self._connected = False
                    if self._close_requested:
                        self._close_requested = False
                        self._cond.notify_all()
                    self._cond.wait()
                    continue
                delay = self._queue[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                mark = heapq.heappop(self._queue)[2]
                mark.writing = True
                return mark


def _not_for_the_thread(mark: Mark) -> bool:
    """Settled, written, or being written (``write_now``): the thread drops it."""
    return mark.settled or mark.writing or results.is_written(mark.record)


#: The process's marks (one thread, started on first use).
marks = RunningMarks()
