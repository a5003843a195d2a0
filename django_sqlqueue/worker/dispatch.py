"""Where a poll's batches run: one strategy, chosen once when the worker is built.

The poller (``poller.py``) plans a poll and records its deliveries; then it hands the
poll's batches -- each partition's messages, in offset order (split under concurrency
limits: "Detached batches" below) -- to the worker's :class:`Dispatch`, in one call.
:func:`choose` picks the strategy from the worker's ``--concurrency`` and its consumers'
handler timeouts:

- :class:`Inline` -- on the poll loop's thread, one batch after the other: ``--concurrency
  1`` and no consumer of the worker with a ``timeout`` (``timeout=None``), and the
  in-process drain of ``django_sqlqueue.testing``, which polls on the test's thread;
- :class:`OneHandlerThread` -- ``--concurrency 1`` with a handler timeout (the default:
  each consumer's visibility timeout): the poll's batches run as one job, in the same
  order, on one handler thread, while the poll loop waits for it and watches the
  handlers' timeouts (``threads/watchdog.py``);
- :class:`HandlerPool` -- ``--concurrency N`` > 1: one job per partition on ``N`` handler
  threads (``threads/executor.py``); the poll loop goes on polling the other partitions,
  and a poll fetches no more partitions than threads are free (:meth:`Dispatch.slots`).

The threaded strategies own the worker's :class:`~.threads.executor.PartitionExecutor` and
its :class:`~.threads.watchdog.Watchdog`; their threads start at :meth:`Dispatch.start`
(the worker calls it once its leases are taken) and are drained at :meth:`Dispatch.drain`.
Until then -- a worker driven by ``Worker.poll()`` without ``run()``, as benchmarks and
tests do -- a threaded strategy runs its batches inline, as a worker before ``run()``
always did.

**Detached batches** (rate and concurrency limits, ``limits.py``, "Head of line"). Once a
subscription has delivered a concurrency-limited message in this process, each
partition's batch is split: its keyless concurrency-limited messages run after its other
ones -- and with :class:`HandlerPool`, as a job of their own, *detached*: the poll loop may
fetch the partition again while it runs (its messages are in flight, so they are not
fetched twice; their order does not matter, having no key), the lease keeper still waits
for it before giving the lease back. So an admitted task waiting on its limit's slot holds
neither the batch's other messages nor its partition; its outcomes are written as any
batch's, the watermark moving by compare-and-set (``db/store/acks.py``) whichever of the
two batches ends first. Until such a message is seen, :meth:`Dispatch.split` costs one
attribute check per batch.

This module sits above ``threads/`` and ``batch/`` and imports both; nothing in them
imports it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ..conf import QueueSettings
from ..db.conn import close_all_quietly, tidy_connections
from ..db.retry import Retrying
from ..db.session import handler_thread_connections
from ..db.store import FetchedMessage, QueueStore
from ..instruments import NO_INSTRUMENTS, Instruments
from .batch.handlers import HandlerRunner
from .batch.outcomes import Outcomes, Stats
from .batch.progress import BatchProgress
from .batch.runner import BatchRunner
from .limits import Split
from .outage import OutageReporter
from .subscription import Subscription
from .threads.executor import DeadThread, PartitionExecutor
from .threads.watchdog import Watchdog

#: A poll's batches: each partition's messages in offset order.
Batches = Mapping[int, list[FetchedMessage]]


class BatchRunnerFactory(Protocol):
    """Builds a worker's batch runner from the worker's shared parts (``Worker(batches=...)``):
    :class:`BatchRunner` itself is one, the default; ``functools.partial(BatchRunner, ...)``
    adds arguments."""

    def __call__(
        self, store: QueueStore, conf: QueueSettings, *, stats: Stats, stop_event: threading.Event, db: Retrying
    ) -> BatchRunner: ...


class Dispatch:
    """Runs a poll's batches; see the module docstring. The base class holds no threads."""

    #: The handler threads and their watchdog (None: batches run on the poll loop's thread).
    executor: PartitionExecutor | None = None
    watchdog: Watchdog | None = None

    def __init__(self, batches: BatchRunner) -> None:
        self.batches = batches

    def start(self) -> None:
        """Start the handler threads, if any."""

    def run(self, sub: Subscription, batches: Batches, watermarks: Mapping[int, int]) -> int:
        """Run (or hand out) ``batches``; return how many messages were handled or handed out."""
        raise NotImplementedError

    def slots(self) -> int | None:
        """How many partitions a poll may fetch now (None: any number)."""
        return None

    def split(self, sub: Subscription, batch: list[FetchedMessage]) -> Split:
        """One partition's batch split for running: see "Detached batches" in the module docstring."""
        limiter = self.batches.limiter
        if not limiter.deferring:  # no concurrency-limited delivery seen: nothing to look at
            return Split(batch)
        return limiter.split(sub, batch, lambda m: self.batches.received(sub, m, None))

    def in_order(self, sub: Subscription, batches: Batches) -> tuple[list[FetchedMessage], Outcomes]:
        """A poll's batches as one run, partition after partition, each :meth:`split` in
        order; and the outcomes to start from (the hand-backs of the split)."""
        messages: list[FetchedMessage] = []
        outcomes = Outcomes()
        for key in sorted(batches):
            split = self.split(sub, batches[key])
            messages += split.head
            messages += split.tail
            outcomes.postponed += split.waiting
        return messages, outcomes

    @property
    def saturated(self) -> bool:
        """Whether every handler thread has a batch (the poll loop waits for one to finish)."""
        return False

    def check(self) -> None:
        """Give up the batches whose handler overran its timeout (the watchdog's look)."""

    def next_check(self) -> float | None:
        """Seconds until the next :meth:`check` is due (None: nothing to watch)."""
        return None

    def drain(self) -> None:
        """The worker is stopping: let the batches in hand finish, then stop the threads."""


class Inline(Dispatch):
    """Batches run on the poll loop's thread, one after the other, without a timeout."""

    def __init__(self, batches: BatchRunner, invoke: HandlerRunner) -> None:
        super().__init__(batches)
        #: The poll loop's handler runner (its event loop for ``async def`` handlers).
        self.invoke = invoke

    def run(self, sub: Subscription, batches: Batches, watermarks: Mapping[int, int]) -> int:
        messages, outcomes = self.in_order(sub, batches)
        if outcomes.postponed:
            self.batches.complete(sub, outcomes, watermarks)
        before_batch(sub, messages)
        return self.batches.run(sub, messages, watermarks, self.invoke)


class _Threaded(Dispatch):
    """Batches run on handler threads, watched by the poll loop (the watchdog)."""

    executor: PartitionExecutor
    watchdog: Watchdog

    def __init__(
        self,
        batches: BatchRunner,
        executor: PartitionExecutor,
        watchdog: Watchdog,
        outage: OutageReporter | None,
        invoke: HandlerRunner,
    ) -> None:
        super().__init__(batches)
        #: Until :meth:`start`: batches run on the calling thread.
        self.inline: Inline | None = Inline(batches, invoke)
        self.executor = executor
        self.watchdog = watchdog
        self.outage = outage
        #: Per handler thread: the outage count when it last used its connections.
        self._seen = threading.local()

    def start(self) -> None:
        self.executor.start()
        self.inline = None

    @property
    def saturated(self) -> bool:
        return self.inline is None and self.executor.free == 0

    def check(self) -> None:
        self.watchdog.check()

    def next_check(self) -> float | None:
        return self.watchdog.next_check()

    def drain(self) -> None:
        # The batches in hand finish their current message, hand the rest back and write
        # their outcomes before the worker releases its leases; a handler that overruns
        # its timeout meanwhile is given up, not waited for.
        self.executor.finished.set()
        self.watchdog.drain()

    def _submit(
        self, sub: Subscription, partitions: tuple[int, ...], progress: BatchProgress, detached: bool = False
    ) -> None:
        job = functools.partial(self._on_handler_thread, sub, progress)
        self.executor.submit(sub.in_flight, partitions, job, progress, detached)

    def _on_handler_thread(self, sub: Subscription, progress: BatchProgress, invoke: HandlerRunner) -> int:
        """A job, on the handler thread that took it: run the batch with that thread's runner."""
        outages = 0 if self.outage is None else self.outage.outages
        if getattr(self._seen, "outages", 0) != outages:
            # The database was unreachable since this thread's last batch: its idle
            # connection is likely dead server-side; a new one, rather than a handler
            # failing on the stale one.
            close_all_quietly()
            self._seen.outages = outages
        tidy_connections()
        before_batch(sub, progress.messages)
        return self.batches.run(sub, list(progress.messages), progress.watermarks, invoke, progress)


class OneHandlerThread(_Threaded):
    """``--concurrency 1`` with a handler timeout: one job per poll, and the poll loop waits."""

    def run(self, sub: Subscription, batches: Batches, watermarks: Mapping[int, int]) -> int:
        if self.inline is not None:
            return self.inline.run(sub, batches, watermarks)
        # This poll's batches run one after another as one job (one hand-off per poll), as
        # they would on this thread, while this thread watches their timeouts.
        messages, outcomes = self.in_order(sub, batches)
        self._submit(sub, tuple(sorted(batches)), BatchProgress(sub, messages, dict(watermarks), outcomes))
        self.watchdog.wait_idle()
        return len(messages)


class HandlerPool(_Threaded):
    """``--concurrency N`` > 1: one job per partition; the poll loop goes on polling."""

    def run(self, sub: Subscription, batches: Batches, watermarks: Mapping[int, int]) -> int:
        if self.inline is not None:
            return self.inline.run(sub, batches, watermarks)
        for key in sorted(batches):
            split, marks = self.split(sub, batches[key]), {key: watermarks[key]}
            outcomes = Outcomes()
            outcomes.postponed += split.waiting  # written with the first job's outcomes
            if split.head or not split.tail:
                self._submit(sub, (key,), BatchProgress(sub, split.head, marks, outcomes))
                outcomes = Outcomes()
            if split.tail:  # detached: the partition's next batch need not wait for them
                self._submit(sub, (key,), BatchProgress(sub, split.tail, marks, outcomes), detached=True)
        return sum(len(batch) for batch in batches.values())

    def slots(self) -> int | None:
        return None if self.inline is not None else self.executor.free


def before_batch(sub: Subscription, messages: Sequence[FetchedMessage]) -> None:
    """Hand a batch's messages to its handler's ``before_batch(messages)`` if it has one, on
    the batch's thread before any of them runs and after the fetch committed their
    deliveries (the tasks backend's cancel check, ``tasks/precheck.py``)."""
    hook = getattr(sub.spec.handler, "before_batch", None)
    if hook is not None:
        hook(messages)


def handler_threads(concurrency: int, subscriptions: Iterable[Subscription]) -> bool:
    """Whether batches run on handler threads: with ``--concurrency`` > 1, or when a
    consumer's handler has a timeout (the poll loop must stay free to watch it)."""
    return concurrency > 1 or any(
        sub.options.timeout is not None or sub.spec.timeout_for is not None for sub in subscriptions
    )


def choose(
    batches: BatchRunner,
    *,
    concurrency: int,
    handler_threads: bool,
    invoke: HandlerRunner,
    on_death: Callable[[DeadThread], None],
    finished: threading.Event,
    outage: OutageReporter | None = None,
    instruments: Instruments = NO_INSTRUMENTS,
) -> Dispatch:
    """The strategy for a worker's ``batches`` (see the module docstring); its threads are
    not started. The watchdog writes on the runner's store, through its retrying ``db``.

    ``handler_threads``: see :func:`handler_threads` (False for an inline worker).
    ``on_death`` hears of a handler thread that died and of more stuck threads than
    ``concurrency``; ``finished`` is set whenever a batch finishes (the event the poll loop
    sleeps on).
    """
    if not handler_threads:
        return Inline(batches, invoke)
    # Each handler thread's engine transactions (its batches' fenced outcome writes) carry
    # the poll loop's idle bound; its handlers' transactions do not (db/session.py).
    bound = batches.conf.LEASE_DURATION - batches.conf.LEASE_RENEW_INTERVAL
    executor = PartitionExecutor(
        concurrency,
        on_death=on_death,
        finished=finished,
        start=False,
        thread_context=functools.partial(handler_thread_connections, batches.store.using, bound),
    )
    watchdog = Watchdog(executor, batches.store, batches, db=batches.db, on_stuck=on_death, instruments=instruments)
    kind = OneHandlerThread if concurrency == 1 else HandlerPool
    return kind(batches, executor, watchdog, outage, invoke)
