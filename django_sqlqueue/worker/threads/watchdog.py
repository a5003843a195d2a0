"""Handler timeouts: a handler that stops making progress gives its partition up.

Every consumer has a ``timeout`` (``@consumer(timeout=...)``; by default its visibility
timeout; ``None`` disables it): how long one handler call may run without progress. A
call to ``message.extend_visibility()`` is progress and restarts the clock, so long
handlers that keep their message visible-to-nobody keep running.

Handlers with a timeout run on handler threads (``executor.py``): with
``--concurrency 1`` one thread, to which the poll loop hands each poll's batches and
waits. The poll loop is the **watchdog**: while it waits, and between polls, it checks
each running batch's :class:`~django_sqlqueue.worker.batch.progress.BatchProgress`. When a handler
is past its deadline the watchdog, on the poll loop's thread and connection:

1. takes the batch over (``BatchProgress.abandon``), logs one WARNING naming the
   handler, the message, the time it has run and where its thread is stuck;
2. writes what the batch had decided so far (acks, nacks, dead letters), fails the
   attempt in hand with a :class:`~django_sqlqueue.exceptions.HandlerTimeout` -- a nack
   with backoff, or a dead letter on its last attempt -- and hands the rest of the batch
   back (attempt not counted). These writes are fenced by the lease like any batch's;
3. gives the partition up: out of ``held`` and its lease released, so another worker
   (or this one, once it is below its fair share again) takes it at once and carries on
   from the watermark;
4. starts a new handler thread in place of the stuck one, so the worker keeps serving
   its other partitions at full strength.

**The stuck thread.** A Python thread cannot be killed. It goes on running the handler;
if the handler ever returns, its outcome is dropped (the batch was taken over, and its
partition is no longer this worker's to write -- the lease fence would drop a late write
too), and the thread exits. Meanwhile it keeps what it holds: memory, the handler's open
database connection (and the locks of any transaction the handler left open). To bound
that, once more threads are stuck than ``--concurrency`` the worker stops -- handing its
in-flight messages and leases back like on SIGTERM -- and exits non-zero
(:class:`~django_sqlqueue.exceptions.HandlersStuck`) for its process manager to start a
fresh process.

**Async handlers** are cancelled at their deadline on their own thread
(``handlers.py``): the attempt fails with ``HandlerTimeout`` through the ordinary path
and no thread is lost. Only one that blocks its event loop is abandoned, after a grace
of :data:`~django_sqlqueue.worker.batch.progress.CANCEL_GRACE` seconds.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable

from ... import signals
from ...db.retry import Retrying
from ...db.store import FetchedMessage, QueueStore
from ...exceptions import HandlersStuck, HandlerTimeout
from ...instruments import NO_INSTRUMENTS, Instruments
from ..batch.outcomes import Outcomes, attempt_number
from ..batch.progress import BatchProgress
from ..batch.runner import BatchRunner
from ..subscription import Subscription
from .executor import DeadThread, Job, PartitionExecutor

# A child of "django_sqlqueue.worker": configuring that logger still catches these records.
logger = logging.getLogger(__name__)

#: Longest wait between two looks while batches are in the executor (seconds): a handler
#: that starts meanwhile is seen within it.
CHECK_INTERVAL = 0.25
#: Frames of the stuck thread's stack shown in the WARNING and the attempt's error.
STACK_FRAMES = 6


class Watchdog:
    """Gives up batches whose handler overran its timeout; see the module docstring."""

    def __init__(
        self,
        executor: PartitionExecutor,
        store: QueueStore,
        batches: BatchRunner,
        *,
        db: Retrying,
        on_stuck: Callable[[DeadThread], None],
        instruments: Instruments = NO_INSTRUMENTS,
    ) -> None:
        self.executor = executor
        self.store = store
        self.batches = batches
        self.db = db
        self._on_stuck = on_stuck
        self.instruments = instruments

    def next_check(self, now: float | None = None) -> float | None:
        """Seconds until the next look: the earliest running handler's deadline, at most
        :data:`CHECK_INTERVAL` (a batch's next handler may start, with its own deadline);
        None when the executor has no batch (nothing to watch).
        """
        if self.executor.free == self.executor.concurrency:
            return None
        now = time.monotonic() if now is None else now
        deadlines = [
            d for job in self.executor.running() if job.progress is not None and (d := job.progress.watchdog_deadline())
        ]
        if not deadlines:
            return CHECK_INTERVAL
        return min(CHECK_INTERVAL, max(0.0, min(deadlines) - now) + 0.01)

    def check(self) -> int:
        """Give up every batch whose handler is past its deadline; return how many."""
        now = time.monotonic()
        given_up = 0
        for job in self.executor.running():
            progress = job.progress
            if progress is None:
                continue
            taken = progress.abandon(now)
            if taken is None:
                continue
            index, elapsed, timeout = taken
            self._give_up(progress.sub, job, progress, index, elapsed, timeout)
            given_up += 1
        return given_up

    def drain(self) -> None:
        """Stop the handler threads once the batches queued and in hand are done, giving up
        those whose handler overruns its timeout meanwhile (the worker is stopping)."""
        self.executor.close()
        while not self.executor.join(self.next_check() or CHECK_INTERVAL):
            self.check()

    def wait_idle(self) -> None:
        """Wait until every batch handed to the executor is done or given up (``--concurrency 1``)."""
        while not self.executor.wait_idle(self.next_check() or CHECK_INTERVAL):
            self.check()

    # -- giving a batch up ---------------------------------------------------------------

    def _give_up(
        self, sub: Subscription, job: Job, progress: BatchProgress, index: int, elapsed: float, timeout: float
    ) -> None:
        message: FetchedMessage = progress.messages[index]
        handler = _qualname(sub.spec.handler)
        stack = _stack_of(job)
        attempt = attempt_number(message)
        logger.warning(
            "handler timed out, giving its partition up handler=%s group=%s topic=%s partition=%d offset=%d id=%s "
            "attempt=%d/%d ran=%.1fs timeout=%gs; the attempt failed (%s); its thread is abandoned (%d stuck, "
            "a new thread takes its place)%s",
            handler,
            sub.group,
            sub.topic,
            message.partition,
            message.offset,
            message.id,
            attempt,
            sub.options.max_attempts,
            elapsed,
            timeout,
            "dead letter" if attempt >= sub.options.max_attempts else "retried after the backoff",
            self.executor.stuck + 1,
            f"; stuck at:\n{stack}" if stack else "",
        )
        error = HandlerTimeout(
            f"handler {handler} ran {elapsed:.1f}s, over its timeout of {timeout:g}s without progress; "
            f"its thread was abandoned" + (f", stuck at:\n{stack}" if stack else "")
        )
        hook = sub.spec.on_timeout
        if hook is not None:
            try:
                hook(message.id, message.payload, attempt, error, attempt >= sub.options.max_attempts)
            except Exception:  # the attempt is failed all the same
                logger.exception("on_timeout hook failed group=%s topic=%s id=%s", sub.group, sub.topic, message.id)
        outcomes: Outcomes = progress.outcomes
        self.batches.failed(sub, message, attempt, error, outcomes, log=False)  # logged above
        if progress.span is not None:
            # The batch thread will not record this attempt now: the span ends here, once.
            progress.span.end(error)
        if progress.received is not None:
            final = attempt >= sub.options.max_attempts
            signals.send(
                signals.message_failed, sub.topic, message=progress.received, duration=elapsed, error=error, final=final
            )
        outcomes.unprocessed.extend((m.partition, m.offset) for m in progress.messages[index + 1 :])
        # atomic="batch": messages handled in the batch's open transaction, which the late
        # handler thread rolls back (start_commit is refused now): they were not done.
        outcomes.unprocessed.extend(outcomes.pending)
        outcomes.pending.clear()
        try:
            self.batches.complete(sub, outcomes, progress.watermarks)
        except Exception:  # the database is gone: the messages come back after their visibility timeout
            logger.exception(
                "could not write a timed-out batch's outcomes group=%s topic=%s partition=%d",
                sub.group,
                sub.topic,
                message.partition,
            )
        self._release(sub, message.partition)
        if self.executor.abandon(job) and self.executor.stuck > self.executor.concurrency:
            stuck = self.executor.stuck
            self._on_stuck(
                DeadThread(
                    "handler",
                    HandlersStuck(
                        f"{stuck} handler threads are stuck in handlers that overran their timeout, more than "
                        f"--concurrency {self.executor.concurrency}; the worker exits so that a fresh process "
                        "replaces it (a Python thread cannot be killed)"
                    ),
                )
            )

    def _release(self, sub: Subscription, partition: int) -> None:
        """Give ``partition`` up: no more batches of it here, and its lease goes now.

        ``held`` is the lease keeper's: the partition leaves it through
        ``Subscription.giving_up``, so that a keeper round that read the lease before this
        release cannot put it back (``subscription.py``).
        """
        with sub.giving_up(partition):
            try:
                self.db(
                    "release lease",
                    lambda: self.store.release_leases(sub.group, sub.topic, sub.name, [partition]),
                )
                self.instruments.leases(sub.group, sub.topic, released=1)
            except Exception:  # it expires within a lease duration instead
                logger.exception(
                    "could not release the lease of a timed-out partition group=%s topic=%s partition=%d",
                    sub.group,
                    sub.topic,
                    partition,
                )


def _qualname(fn: Callable[..., object]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _stack_of(job: Job) -> str:
    """The innermost frames of the stuck thread (where the handler waits), or ""."""
    thread = job.thread
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    if frame is None:
        return ""
    lines = traceback.format_stack(frame)[-STACK_FRAMES:]
    return "".join(lines).rstrip()
