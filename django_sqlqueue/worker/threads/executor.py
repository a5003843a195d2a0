"""Running batches on handler threads (``runconsumer --concurrency N``, and handler timeouts).

The poll loop (``loop.py``, ``poller.py``) stays the only place that decides what to
deliver: it polls, records the deliveries and hands each partition's batch to a
:class:`PartitionExecutor`, through the worker's dispatch strategy (``dispatch.py``). The
executor runs batches on ``N`` handler threads, started when the worker starts:

- **Order within a partition.** A partition has at most one batch in the executor at a
  time (``busy``); the poll loop does not fetch a busy partition, so the next batch of a
  partition is fetched only after the previous one was acked or nacked. Batches of
  different partitions run in parallel.
- **Outcomes.** A handler thread runs its batch's messages one by one and then writes
  their outcomes (acks, nacks, dead letters) itself, on its own connection. Those writes
  are fenced by the lease exactly as on the poll loop (``db/store/acks.py``).
- **Hand-over with the lease keeper.** The keeper removes a partition from
  ``Subscription.held`` and then waits (``PartitionsInFlight.wait_idle``, in
  ``subscription.py``) until the batch of that partition in the executor has finished
  before it releases the lease -- the same promise the ``poll_lock`` gives for the
  single-threaded worker.
- **Connections.** Django connections are per thread: each handler thread opens its own
  on first use, tidies it after each batch (broken or expired ones are closed) and
  closes all of them when it exits.
- **Async handlers.** Each handler thread owns a :class:`~django_sqlqueue.worker.batch.handlers.HandlerRunner`
  and so its own event loop: async handlers of different partitions run concurrently,
  one per thread.
- **Drain.** :meth:`PartitionExecutor.shutdown` waits for the batches in hand; a batch
  sees the worker's stop event and hands its remaining messages back unprocessed.
- **A batch that fails outside its handlers** (an asynchronous ``SystemExit`` raised into
  the thread while it writes outcomes, say) is logged; the batch hands back the messages
  it had not run (``batch/runner.py``) and the thread takes the next batch.
- **A handler that overruns its timeout** (``watchdog.py``): the watchdog takes its
  batch over and :meth:`PartitionExecutor.abandon` frees its partition and starts a new
  thread in the stuck one's place, so the worker keeps ``N`` threads serving; the stuck
  thread exits when (if ever) the handler returns (:attr:`PartitionExecutor.stuck`
  counts them meanwhile).
- **A handler thread that dies** (an exception raised into it between batches) is
  reported through ``on_death``: the worker stops, hands back what it can, releases its
  leases and exits non-zero for a restart, as when a side thread dies (``service.py``).
  A batch the dead thread had taken but not started stays in flight and is redelivered
  after its visibility timeout: late, never lost.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ...db.conn import close_all_quietly
from ..batch.handlers import HandlerRunner
from ..batch.progress import BatchProgress
from ..subscription import PartitionsInFlight
from .service import log_death

logger = logging.getLogger(__name__)

#: What a handler thread runs: a batch callable taking the thread's handler runner.
BatchJob = Callable[[HandlerRunner], object]


@dataclass(frozen=True)
class DeadThread:
    """A handler thread that died, as the worker reports it (like a dead side thread)."""

    title: str
    error: BaseException


@dataclass(eq=False)
class Job:
    """One batch submitted to the executor."""

    in_flight: PartitionsInFlight
    #: The partitions whose batches it runs (one, or with ``--concurrency 1`` a whole poll's).
    partitions: tuple[int, ...]
    run: BatchJob
    #: Shared with the watchdog (None: the batch is not timed).
    progress: BatchProgress | None = None
    #: A detached batch: its partitions stay pollable while it runs (``PartitionsInFlight``).
    detached: bool = False
    #: The thread running it (None: queued).
    thread: threading.Thread | None = None
    #: Finished or abandoned (set once, under the executor's lock).
    closed: bool = False


class PartitionExecutor:
    """``concurrency`` handler threads that run per-partition batches; see the module docstring."""

    def __init__(
        self,
        concurrency: int,
        *,
        name: str = "sqlqueue-handler",
        on_death: Callable[[DeadThread], None] | None = None,
        finished: threading.Event | None = None,
        start: bool = True,
        thread_context: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``on_death(dead)`` is called on a handler thread that dies (see the module docstring).
        ``finished``: the event to set when a batch finishes (the worker passes the one its
        poll loop sleeps on; default: a new one). ``start``: start the threads now (False:
        at :meth:`start`; the worker builds its executor with its other parts and starts
        the threads once its leases are taken). ``thread_context``: entered by each handler
        thread around its whole life (the worker's: ``db.session.handler_thread_connections``)."""
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        self.concurrency = concurrency
        self._name = name
        self._on_death = on_death
        self._thread_context = thread_context or nullcontext
        #: Handler threads that died (normally none).
        self.dead: list[DeadThread] = []
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: Notified whenever a batch finishes or is abandoned.
        self._changed = threading.Condition(self._lock)
        self._running = 0
        self._serial = 0
        #: The jobs being run, by thread.
        self._current: dict[threading.Thread, Job] = {}
        #: Threads abandoned in a handler that overran its timeout and not back yet.
        self._stuck: set[threading.Thread] = set()
        #: Set whenever a batch finishes: the poll loop waits on it instead of sleeping blindly.
        self.finished = finished if finished is not None else threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        """Start the ``concurrency`` handler threads (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for _ in range(self.concurrency):
                self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._thread_main, name=f"{self._name}-{self._serial}", daemon=True)
        self._serial += 1
        self._threads.append(thread)
        thread.start()

    @property
    def free(self) -> int:
        """Handler threads without a batch (batches queued count as taken)."""
        with self._lock:
            return self.concurrency - self._running

    @property
    def stuck(self) -> int:
        """Handler threads abandoned in a handler that has not returned yet."""
        with self._lock:
            return len(self._stuck)

    def submit(
        self,
        in_flight: PartitionsInFlight,
        partitions: int | tuple[int, ...],
        job: BatchJob,
        progress: BatchProgress | None = None,
        detached: bool = False,
    ) -> None:
        """Run ``job`` on a handler thread; its ``partitions`` are busy until it returns (or is
        abandoned) -- ``detached``: only for the lease keeper, not for the poll loop."""
        if isinstance(partitions, int):
            partitions = (partitions,)
        in_flight.add(partitions, detached)
        with self._lock:
            self._running += 1
        self._jobs.put(Job(in_flight, partitions, job, progress, detached=detached))

    def running(self) -> list[Job]:
        """The jobs a handler thread is running now."""
        with self._lock:
            return list(self._current.values())

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no batch is queued or running, or a handler thread died (the worker
        is stopping: a batch the dead thread had taken will never finish); True if so."""
        with self._changed:
            return self._changed.wait_for(lambda: self._running == 0 or bool(self.dead), timeout=timeout)

    def abandon(self, job: Job) -> bool:
        """Give up on ``job``, whose handler overran its timeout (the watchdog took its batch over).

        Its partitions are free again, and a new thread takes the stuck one's place; the stuck
        thread exits when (if ever) its handler returns. False if the job finished meanwhile
        (nothing to replace).
        """
        with self._lock:
            if job.closed or job.thread is None:
                return False
            job.closed = True
            self._current.pop(job.thread, None)
            self._stuck.add(job.thread)
            self._threads.remove(job.thread)
            self._running -= 1
            self._changed.notify_all()
            self._start_thread()
        job.in_flight.discard(job.partitions, job.detached)
        self.finished.set()
        return True

    def close(self) -> None:
        """Let the batches queued and in hand finish, then stop the threads (see :meth:`join`).

        A thread that takes a stuck one's place meanwhile (``abandon``) inherits its stop
        sentinel: the stuck thread never takes it.
        """
        with self._lock:
            threads = len(self._threads)
        for _ in range(threads):
            self._jobs.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the threads to end after :meth:`close`; True if all did (stuck threads
        are not waited for: they are daemon threads)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            return not any(t.is_alive() for t in self._threads)

    def shutdown(self, timeout: float | None = None) -> bool:
        """:meth:`close` and :meth:`join`: True if every thread stopped in time."""
        self.close()
        return self.join(timeout)

    def _thread_main(self) -> None:
        runner = HandlerRunner()
        try:
            with self._thread_context():
                self._serve(runner)
        except BaseException as exc:  # noqa: BLE001 - logged and reported to the worker, which stops
            dead = DeadThread(f"handler {threading.current_thread().name}", exc)
            with self._lock:
                self.dead.append(dead)
                self._changed.notify_all()
            log_death(logger, dead.title, exc)
            if self._on_death is not None:
                self._on_death(dead)
        finally:
            runner.close()
            close_all_quietly()
            with self._lock:
                self._stuck.discard(threading.current_thread())

    def _serve(self, runner: HandlerRunner) -> None:
        me = threading.current_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                job.thread = me
                self._current[me] = job
            try:
                job.run(runner)
            except BaseException:  # the batch handed back what it could (batch/runner.py)
                logger.exception("batch of partition(s) %s failed outside its handlers", job.partitions)
                close_all_quietly()
            finally:
                with self._lock:
                    abandoned = job.closed
                    if not abandoned:
                        job.closed = True
                        self._current.pop(me, None)
                        self._running -= 1
                        self._changed.notify_all()
                if not abandoned:
                    job.in_flight.discard(job.partitions, job.detached)
                self.finished.set()
            if abandoned:
                logger.info("an abandoned handler thread's handler returned; the thread exits thread=%s", me.name)
                return
