"""A worker's membership in one (consumer group, topic): what it holds and how it runs.

Several threads of a worker share a :class:`Subscription`. Each field has one owning
thread; the two fields that another thread writes as well change only through the small
methods below, under the subscription's own lock:

- ``held`` (the partitions this worker may deliver) belongs to the **lease keeper**
  (``threads/leasing.py``): it sets it from what the database says at the end of a
  round, on a hand-over and at shutdown (:meth:`Subscription.settle`). The one other
  writer is the **poll loop's watchdog** (``threads/watchdog.py``), which takes out a
  partition whose handler overran its timeout and releases its lease
  (:meth:`Subscription.giving_up`). A keeper round that read its leases before that
  release must not put the partition back: ``settle`` leaves out what was given up since
  the round began (:meth:`Subscription.start_lease_round`). Readers -- the poll loop, the
  handler threads, the listener, the collector -- read the frozenset without a lock:
  replacing it is atomic.
- ``missing_offsets`` (held partitions a poll found without the group's watermark row):
  the **poll loop** adds to it (:meth:`Subscription.report_missing`), the **keeper**
  takes it and empties it in one step (:meth:`Subscription.take_missing`) and creates
  the rows, so a report made meanwhile waits for the keeper's next look, never lost.
- ``paused``, ``active``, ``cap`` and ``rank`` are the keeper's alone (its thread writes
  and reads them).
- ``ready``, ``poll_lock`` and ``in_flight`` are the hand-shakes between the threads;
  see each field.

Lock order: the subscription's lock is held for a few assignments only -- never across a
statement, and never while waiting for ``poll_lock`` or ``in_flight`` -- so it cannot
deadlock with them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..conf import QueueSettings
from ..consumers import ConsumerOptions, ConsumerSpec


class PartitionsInFlight:
    """The partitions of one subscription whose batch is on a handler thread (thread-safe).

    The executor adds a batch's partitions when the poll loop submits it and discards
    them when it finishes or is given up (``threads/executor.py``); the poll loop does
    not fetch a busy partition, and the lease keeper waits here before giving a lease back.
    """

    def __init__(self) -> None:
        self._busy: set[int] = set()
        #: Partitions with *detached* batches on handler threads, counted: the poll loop
        #: may fetch them, the lease keeper waits for them (``dispatch.py``).
        self._detached: Counter[int] = Counter()
        self._cond = threading.Condition()

    def add(self, partitions: tuple[int, ...], detached: bool = False) -> None:
        with self._cond:
            if detached:
                self._detached.update(partitions)
            else:
                self._busy.update(partitions)

    def discard(self, partitions: tuple[int, ...], detached: bool = False) -> None:
        with self._cond:
            if detached:
                self._detached.subtract(partitions)
                self._detached = +self._detached  # drops the partitions counted down to 0
            else:
                self._busy.difference_update(partitions)
            self._cond.notify_all()

    def snapshot(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._busy)

    def wait_idle(self, partitions: frozenset[int] | set[int] | list[int] | None, timeout: float) -> bool:
        """Wait until none of ``partitions`` (None: any partition) has a batch in flight."""
        wanted = None if partitions is None else set(partitions)

        def idle() -> bool:
            busy = self._busy | self._detached.keys()
            return not (busy if wanted is None else busy & wanted)

        with self._cond:
            return self._cond.wait_for(idle, timeout=timeout)


@dataclass
class Subscription:
    """One registered consumer run by one worker under subscriber name ``name``.

    Which thread writes which field: see the module docstring.
    """

    spec: ConsumerSpec
    options: ConsumerOptions
    name: str
    #: The partitions this worker may deliver (the keeper's; see the module docstring).
    held: frozenset[int] = frozenset()
    #: One partition per key (partitions are discovered as keys appear).
    per_key: bool = False
    #: Paused by an operator at the last lease round.
    paused: bool = False
    #: Live subscribers and fair share seen by the last lease round (None: unknown).
    active: int | None = None
    cap: int | None = None
    #: This subscriber's place in the sorted live names (None: unknown); see leasing.
    rank: int | None = None
    #: Held partitions the poll found without the group's watermark row: the keeper
    #: creates them (it is the one place that creates watermark rows). Changed only by
    #: :meth:`report_missing` and :meth:`take_missing`.
    missing_offsets: frozenset[int] = frozenset()
    #: Set once the keeper has run its first round (leases taken or not).
    ready: threading.Event = field(default_factory=threading.Event)
    #: Held by the poll loop during a poll; the keeper takes it before giving leases back.
    poll_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Partitions whose batch runs on a handler thread: the keeper waits for them too
    #: before giving a lease back (django_sqlqueue.worker.threads.executor).
    in_flight: PartitionsInFlight = field(default_factory=PartitionsInFlight)
    #: Guards ``held`` and ``missing_offsets`` writes and the give-up book-keeping below.
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    #: Partitions given up since the keeper's current round began (it must not keep them).
    _given_up: set[int] = field(default_factory=set, init=False, repr=False, compare=False)
    #: Partitions given up whose lease release has not finished yet.
    _releasing: set[int] = field(default_factory=set, init=False, repr=False, compare=False)

    @classmethod
    def create(cls, spec: ConsumerSpec, name: str, conf: QueueSettings) -> Subscription:
        return cls(spec=spec, options=spec.resolve(conf), name=name, per_key=conf.partitions_for(spec.topic) is None)

    @property
    def group(self) -> str:
        return self.spec.group

    @property
    def topic(self) -> str:
        return self.spec.topic

    @property
    def strict(self) -> bool:
        """batch_size=1: at most one message of a partition in flight at a time."""
        return self.options.batch_size == 1

    # -- held: the keeper sets it, the watchdog takes partitions out ------------------------

    def start_lease_round(self) -> None:
        """The keeper is about to read this subscription's leases from the database.

        Give-ups whose release has finished are in the database already (the round will
        not renew them) and are forgotten; one still releasing is kept: the round may read
        its lease before the release lands.
        """
        with self._lock:
            self._given_up = set(self._releasing)

    def settle(self, partitions: Iterable[int]) -> frozenset[int]:
        """Hold ``partitions`` (what the keeper read from the database), less those given up
        since :meth:`start_lease_round`; return the new ``held``. The keeper's thread only."""
        with self._lock:
            self.held = frozenset(partitions) - self._given_up
            return self.held

    @contextmanager
    def giving_up(self, partition: int) -> Iterator[None]:
        """Take ``partition`` out of ``held`` now; the block releases its lease.

        The poll loop's watchdog, for a partition whose handler overran its timeout: no
        poll delivers it from here on, and no lease round that read the lease before the
        release is over puts it back (:meth:`settle`).
        """
        with self._lock:
            self.held = self.held - {partition}
            self._given_up.add(partition)
            self._releasing.add(partition)
        try:
            yield
        finally:
            with self._lock:
                self._releasing.discard(partition)

    # -- missing_offsets: the poll loop reports, the keeper takes ------------------------

    def report_missing(self, partitions: Iterable[int]) -> None:
        """The poll loop found held ``partitions`` without the group's watermark row."""
        with self._lock:
            self.missing_offsets = self.missing_offsets | frozenset(partitions)

    def take_missing(self) -> frozenset[int]:
        """The partitions reported missing so far, and none from now on (the keeper's, which
        creates their rows); a report made after this waits for the next call."""
        with self._lock:
            missing, self.missing_offsets = self.missing_offsets, frozenset()
            return missing
