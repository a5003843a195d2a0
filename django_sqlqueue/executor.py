"""Running the batches of different partitions in parallel (``runconsumer --concurrency N``).

The poll loop (``worker.py``) stays the only place that decides what to deliver: it
polls, records the deliveries and hands each partition's batch to a
:class:`PartitionExecutor`. The executor runs batches on ``N`` handler threads:

- **Order within a partition.** A partition has at most one batch in the executor at a
  time (``busy``); the poll loop does not fetch a busy partition, so the next batch of a
  partition is fetched only after the previous one was acked or nacked. Batches of
  different partitions run in parallel.
- **Outcomes.** A handler thread runs its batch's messages one by one and then writes
  their outcomes (acks, nacks, dead letters) itself, on its own connection. Those writes
  are fenced by the lease exactly as on the poll loop (``store/acks.py``).
- **Hand-over with the lease keeper.** The keeper removes a partition from
  ``Subscription.held`` and then waits (``PartitionsInFlight.wait_idle``) until the batch
  of that partition in the executor has finished before it releases the lease -- the
  same promise the ``poll_lock`` gives for the single-threaded worker.
- **Connections.** Django connections are per thread: each handler thread opens its own
  on first use, tidies it after each batch (broken or expired ones are closed) and
  closes all of them when it exits.
- **Async handlers.** Each handler thread owns a :class:`~django_sqlqueue.handlers.HandlerRunner`
  and so its own event loop: async handlers of different partitions run concurrently,
  one per thread.
- **Drain.** :meth:`PartitionExecutor.shutdown` waits for the batches in hand; a batch
  sees the worker's stop event and hands its remaining messages back unprocessed.
- **A batch that fails outside its handlers** (an asynchronous ``SystemExit`` raised into
  the thread while it writes outcomes, say) is logged; the batch hands back the messages
  it had not run (``batch.py``) and the thread takes the next batch.
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
from collections.abc import Callable
from dataclasses import dataclass

from .dbconn import close_all_quietly
from .handlers import HandlerRunner
from .service import log_death

logger = logging.getLogger(__name__)

#: What a handler thread runs: a batch callable taking the thread's handler runner.
BatchJob = Callable[[HandlerRunner], object]


@dataclass(frozen=True)
class DeadThread:
    """A handler thread that died, as the worker reports it (like a dead side thread)."""

    title: str
    error: BaseException


class PartitionsInFlight:
    """The partitions of one subscription whose batch is in the executor (thread-safe)."""

    def __init__(self) -> None:
        self._busy: set[int] = set()
        self._cond = threading.Condition()

    def add(self, partition: int) -> None:
        with self._cond:
            self._busy.add(partition)

    def discard(self, partition: int) -> None:
        with self._cond:
            self._busy.discard(partition)
            self._cond.notify_all()

    def snapshot(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._busy)

    def wait_idle(self, partitions: frozenset[int] | set[int] | list[int] | None, timeout: float) -> bool:
        """Wait until none of ``partitions`` (None: any partition) has a batch in flight."""
        wanted = None if partitions is None else set(partitions)

        def idle() -> bool:
            return not (self._busy if wanted is None else self._busy & wanted)

        with self._cond:
            return self._cond.wait_for(idle, timeout=timeout)


class PartitionExecutor:
    """``concurrency`` handler threads that run per-partition batches; see the module docstring."""

    def __init__(
        self,
        concurrency: int,
        *,
        name: str = "sqlqueue-handler",
        on_death: Callable[[DeadThread], None] | None = None,
    ) -> None:
        """``on_death(dead)`` is called on a handler thread that dies (see the module docstring)."""
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        self.concurrency = concurrency
        self._on_death = on_death
        #: Handler threads that died (normally none).
        self.dead: list[DeadThread] = []
        self._jobs: queue.SimpleQueue[tuple[PartitionsInFlight, int, BatchJob] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = 0
        #: Set whenever a batch finishes: the poll loop waits on it instead of sleeping blindly.
        self.finished = threading.Event()
        self._threads = [
            threading.Thread(target=self._thread_main, name=f"{name}-{i}", daemon=True) for i in range(concurrency)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def free(self) -> int:
        """Handler threads without a batch (batches queued count as taken)."""
        with self._lock:
            return self.concurrency - self._running

    def submit(self, in_flight: PartitionsInFlight, partition: int, job: BatchJob) -> None:
        """Run ``job`` on a handler thread; ``partition`` is busy until it returns."""
        in_flight.add(partition)
        with self._lock:
            self._running += 1
        self._jobs.put((in_flight, partition, job))

    def shutdown(self, timeout: float | None = None) -> bool:
        """Let the batches in hand finish, then stop the threads; True if all stopped in time."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def _thread_main(self) -> None:
        runner = HandlerRunner()
        try:
            self._serve(runner)
        except BaseException as exc:  # noqa: BLE001 - logged and reported to the worker, which stops
            dead = DeadThread(f"handler {threading.current_thread().name}", exc)
            self.dead.append(dead)
            log_death(logger, dead.title, exc)
            if self._on_death is not None:
                self._on_death(dead)
        finally:
            runner.close()
            close_all_quietly()

    def _serve(self, runner: HandlerRunner) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            in_flight, partition, job = item
            try:
                job(runner)
            except BaseException:  # the batch handed back what it could (batch.py)
                logger.exception("batch of partition %s failed outside its handlers", partition)
                close_all_quietly()
            finally:
                in_flight.discard(partition)
                with self._lock:
                    self._running -= 1
                self.finished.set()
