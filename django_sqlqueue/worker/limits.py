"""Rate and concurrency limits, checked just before a handler is called for a message.

What a delivery is limited by comes from its consumer: ``@consumer(..., rate_limit="20/s")``
(``ConsumerSpec.rate_limit``) and, per message, ``ConsumerSpec.limits_for`` (the tasks
backend's ``@rate_limit`` and ``@concurrency_limit``, ``tasks/limits.py``). A consumer with
neither pays nothing: the runner does not even call in here (``batch/runner.py``).

:meth:`Limiter.admit` asks the database (``db/store/limits.py``: GCRA for rates, slots for
concurrency; each admission one conditional write, across every worker process) and
returns an :class:`Admission`: run now (holding a slot, released by :meth:`Limiter.release`
when the attempt ends -- returned, raised or timed out), or **wait** a number of seconds.
A waiting delivery is not an attempt: the runner hands it back to the queue with that
delay (``Outcomes.postponed``, written by ``postpone_deliveries``: attempt not counted, no
handler call, no result change), and goes on with the batch's next message, so it holds
up neither other keys nor other tasks.

**Order of the checks.** The concurrency slot first (it can be given back), then each rate
(an admission cannot): a rate refusal releases the slot just taken. A task with two
limits refused by the second still consumed an admission of the first.

**Local knowledge.** Once the database refuses a limit, this process knows when it can
next admit (a rate's next admission time; for a full concurrency limit, a short
:data:`FULL_FOR`) and refuses that limit's other deliveries until then *without a
statement*: with a backlog of hundreds of limited tasks, each admission costs a few
statements, not one per waiting message. This only ever refuses more, never admits: the
database decides every admission. Each delivery refused here takes the next place in this
process's *queue of returns* for the limit: a rate's are due one emission interval apart,
from its next admission time on, so they come back about when they can be admitted. The
queue outlives the refusals and admissions: a new refusal does not put a delivery due at
the times of those handed back before it (which would bring back several per admission).

**Waiting for a slot.** A delivery refused a concurrency slot takes the next place in this
process's queue of returns for that limit: due again one *spacing* after the previous
refused one (the average run time of the limit's attempts here, divided by ``n``: about
how often a slot frees), at least :data:`FULL_FOR` from now, +-10%. A released slot only
makes the next delivery ask the database again, so a backlog of waiting tasks returns
about as fast as slots free -- times the number of worker processes that hold some of it
-- instead of every few hundred milliseconds each: each return is a fetch, a delivery and
a hand-back, work the other tasks' drain pays for.

**Waiting in process.** A delivery the database refuses under a rate limit whose next
admission is at most :data:`WAIT_IN_PROCESS` (0.1 s, in all) away waits for it in its
handler thread and asks again, instead of going back to the queue: a delivery handed
back comes back only at the next poll that fetches it, and under GCRA with ``burst=1`` an
admission that no worker claims on time is lost for good -- at 20/s, a few tens of
milliseconds lost per admission cost 8-30% of the rate (``bench/limits.py``). The wait is bounded, so the
batch's next messages are held up by at most that; the process's other deliveries of the
same limit are refused locally meanwhile (they go back to the queue), so mostly one thread
per process waits for a given limit's next admission. Concurrency refusals never
wait in process (a slot frees when a run ends, which may be long).

**Head of line.** A batch runs its messages one after the other on one thread, and its
partition is not polled again until the batch is done: an admitted concurrency-limited
task would hold the batch's next messages -- other keys, other tasks -- and the whole
partition for its run. So once a subscription has delivered a concurrency-limited message
in this process (:attr:`Limiter.deferring`; until then nothing is looked at), each batch
is split (:meth:`Limiter.split`) before it runs: its *keyless* concurrency-limited
messages (a message without a key has no order to keep; one with a key keeps its place)
are handed back at once if this process knows their limit is full, and otherwise run
after the others -- with ``--concurrency`` > 1 as a batch of their own, on another handler
thread, that does not keep the partition from being polled (``dispatch.py``, "Detached
batches"). The keyless ones met before the first split (their batches were not split)
are handed back at once, to come back in a split batch. Their limits are resolved twice
(at the split and at admission): only for such subscriptions.

**A worker killed with kill -9** holds its slots until their ``expires_at``: the handler's
timeout (``task_timeout``, the consumer's ``timeout``) or the visibility timeout, whichever
is longer -- the time after which the queue itself gives the attempt up.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from ..rules.rates import Limits, Rate, limit_name, parse_rate

if TYPE_CHECKING:
    from ..consumers import ReceivedMessage
    from ..db.retry import Retrying
    from ..db.store import FetchedMessage, QueueStore
    from .batch.outcomes import Outcomes
    from .subscription import Subscription

logger = logging.getLogger(__name__)

#: Seconds a full concurrency limit is taken as full by this process without asking again,
#: and the shortest wait of a delivery refused a slot.
FULL_FOR = 0.05
#: The run time assumed of a concurrency-limited task before this process has timed one.
CONCURRENCY_RECHECK = 0.2
#: Concurrency limits whose queue of returns is kept before the past ones are forgotten.
MAX_KNOWN = 10_000
#: The shortest wait: a delivery due again sooner would only be refused again.
MIN_WAIT = 0.01
#: Seconds a delivery refused by a rate limit may wait for its admission in its handler
#: thread, in all, instead of going back to the queue ("Waiting in process" above).
WAIT_IN_PROCESS = 0.1


@dataclass(frozen=True)
class Admission:
    """What :meth:`Limiter.admit` decided for one delivery."""

    #: Seconds to wait before the delivery is tried again (None: admitted, run it now).
    wait: float | None = None
    #: The concurrency slot taken ``(name, slot, holder)``, released when the attempt ends.
    slot: tuple[str, int, str] | None = None


ADMITTED = Admission()


@dataclass
class Split:
    """One partition's batch as :meth:`Limiter.split` divides it, each part in offset order."""

    #: The batch's other messages: they run first, as the partition's batch.
    head: list[FetchedMessage]
    #: Keyless concurrency-limited messages: run after ``head`` (or detached, ``dispatch.py``).
    tail: list[FetchedMessage] = field(default_factory=list)
    #: ``(partition, offset, delay)`` of keyless messages whose concurrency limit this
    #: process knows to be full: handed back to wait without running (``Outcomes.postponed``).
    waiting: list[tuple[int, int, float]] = field(default_factory=list)


def limits_of(sub: Subscription, received: ReceivedMessage) -> Limits | None:
    """What the delivery of ``received`` is limited by (None: nothing)."""
    spec = sub.spec
    limits = spec.limits_for(received) if spec.limits_for is not None else None
    if spec.rate_limit is not None:
        own = Limits(rates=((limit_name("consumer", spec.group, spec.topic), parse_rate(spec.rate_limit)),))
        limits = own if limits is None else own + limits
    return limits or None


class Limiter:
    """Admits deliveries under their limits for one worker (thread-safe: handler threads share it)."""

    def __init__(self, store: QueueStore, db: Retrying) -> None:
        self.store = store
        self.db = db
        self._lock = threading.Lock()
        #: Limit name -> monotonic time until which it is known to refuse ("Local knowledge").
        self._refusing: dict[str, float] = {}
        self._rng = random.Random()
        #: Concurrency limit name -> a moving average of its attempts' seconds (this process's).
        self._runs: dict[str, float] = {}
        #: Limit name -> monotonic time of the next return of a delivery refused here (this
        #: process's queue of returns: "Local knowledge", "Waiting for a slot").
        self._returns: dict[str, float] = {}
        #: ``(group, topic)`` of the subscriptions that delivered a concurrency-limited
        #: message in this process: their batches are split by :meth:`split`.
        self.deferring: set[tuple[str, str]] = set()
        #: The ones of those whose batches :meth:`split` has split since.
        self.splitting: set[tuple[str, str]] = set()

    def split(
        self, sub: Subscription, batch: list[FetchedMessage], received: Callable[[FetchedMessage], ReceivedMessage]
    ) -> Split:
        """One partition's ``batch`` split for running (see "Head of line" in the module
        docstring). ``received``: a message's delivery as its handler would get it."""
        if (sub.group, sub.topic) not in self.deferring:
            return Split(batch)
        self.splitting.add((sub.group, sub.topic))
        split = Split([])
        for m in batch:
            limits = None if m.key or m.undecodable is not None else limits_of(sub, received(m))
            if limits is None or limits.concurrency is None:
                split.head.append(m)
                continue
            name, n = limits.concurrency
            if self._known_refusal(name) is not None:  # no handler thread needed to refuse it
                split.waiting.append((m.partition, m.offset, self._slot_wait(name, n)))
            else:
                split.tail.append(m)
        return split

    def admit(self, sub: Subscription, received: ReceivedMessage, timeout: float | None) -> Admission:
        """Check the delivery's limits; ``timeout``: its handler's (None: none), for a slot's expiry."""
        limits = limits_of(sub, received)
        if limits is None:
            return ADMITTED
        slot: tuple[str, int, str] | None = None
        if limits.concurrency is not None:
            self.deferring.add((sub.group, sub.topic))
            if (sub.group, sub.topic) not in self.splitting and not received.key:
                # Met before this process split a batch of the subscription: its batch was
                # not split, so run, it would hold the batch up. Back at once, to be split.
                return Admission(MIN_WAIT)
            name, n = limits.concurrency
            if self._known_refusal(name) is not None:
                return Admission(self._slot_wait(name, n))
            holder = f"{sub.name}:{received.id}:{received.attempt}"[-255:]
            ttl = max(sub.options.visibility_timeout, timeout or 0.0)
            got = self.db("concurrency slot", lambda: self.store.acquire_slot(name, n, holder, ttl))
            if got is None:
                self._refused(name, FULL_FOR)
                return Admission(self._slot_wait(name, n))
            slot = (name, got, holder)
        for name, rate in limits.rates:
            wait = self._admit_rate(name, rate)
            if wait is not None:
                if slot is not None:
                    self.release(slot)
                return Admission(max(wait, MIN_WAIT))
        return Admission(None, slot)

    def _admit_rate(self, name: str, rate: Rate) -> float | None:
        """Admit one delivery under the rate ``name`` (None), or return its wait. A refusal
        by the database whose next admission is near (within what is left of
        :data:`WAIT_IN_PROCESS`) is waited out here, then asked again: see "Waiting in
        process" in the module docstring."""
        budget = WAIT_IN_PROCESS
        while True:
            known = self._known_refusal(name)
            if known is not None:
                return self._queued(name, rate.interval, known)
            wait = self.db("rate limit", partial(self.store.admit_rate, name, rate.interval, rate.burst))
            if wait is None:
                return None
            # Known here from now on: this process's other deliveries of the limit are
            # refused without a statement (and queued) while this one waits.
            self._refused(name, wait)
            wait = max(wait, MIN_WAIT)
            if wait > budget:
                return self._queued(name, rate.interval, wait)
            budget -= wait
            time.sleep(wait)

    def gate(
        self,
        sub: Subscription,
        received: ReceivedMessage,
        outcomes: Outcomes,
        timeout: float | None,
        attempt: Callable[[], bool],
    ) -> bool:
        """Run ``attempt()`` (the handler call on ``received``, ``batch/runner.py``) if the
        limits admit it, holding its concurrency slot until it returns or raises; else add
        the delivery to ``outcomes.postponed`` (no handler call, attempt not counted).
        Return what ``attempt()`` returned, or True (postponed)."""
        admission = self.admit(sub, received, timeout)
        if admission.wait is not None:
            # No handler in hand: the watchdog cannot take the batch over now (progress.py).
            outcomes.postponed.append((received.partition, received.offset, admission.wait))
            return True
        began = time.monotonic()
        try:
            return attempt()
        finally:
            if admission.slot is not None:
                self._ran(admission.slot[0], time.monotonic() - began)
                self.release(admission.slot)

    def release(self, slot: tuple[str, int, str]) -> None:
        """The attempt holding ``slot`` ended: free it (and forget that its limit was full)."""
        name, number, holder = slot
        try:
            self.db("concurrency slot", lambda: self.store.release_slot(name, number, holder))
        except Exception:  # the slot expires at its expires_at anyway
            logger.exception("could not release a concurrency slot name=%s slot=%d", name, number)
        with self._lock:
            self._refusing.pop(name, None)

    def _known_refusal(self, name: str) -> float | None:
        """Seconds for which this process still knows ``name`` refuses (None: ask the database)."""
        with self._lock:
            until = self._refusing.get(name)
            if until is None:
                return None
            left = until - time.monotonic()
            if left > 0:
                return left
            del self._refusing[name]
            return None

    def _slot_wait(self, name: str, n: int) -> float:
        """The wait of a delivery refused a slot of ``name`` (limit ``n``): :meth:`_queued`
        one *spacing* (this process's average run of the limit / ``n``: about how often a
        slot frees) after the previous one, at least :data:`FULL_FOR` from now, +-10%."""
        return self._queued(name, self._runs.get(name, CONCURRENCY_RECHECK) / n, FULL_FOR, jitter=0.1)

    def _queued(self, name: str, spacing: float, earliest: float, jitter: float = 0.0) -> float:
        """The wait of one more refused delivery of the limit ``name``: the next place in
        this process's queue of returns for it, ``spacing`` after the previous place and at
        least ``earliest`` from now (see "Local knowledge" and "Waiting for a slot" in the
        module docstring); ``jitter``: a random part of it, +-, so that the returns of
        several processes do not stay in step."""
        with self._lock:
            now = time.monotonic()
            at = max(self._returns.get(name, 0.0), now + earliest)
            self._returns[name] = at + spacing
            if len(self._returns) > MAX_KNOWN:  # limits per key: forget the past ones
                self._returns = {k: v for k, v in self._returns.items() if v > now}
        return max(MIN_WAIT, (at - now) * (1.0 + jitter * (2.0 * self._rng.random() - 1.0)))

    def _ran(self, name: str, seconds: float) -> None:
        with self._lock:
            last = self._runs.get(name)
            self._runs[name] = seconds if last is None else 0.8 * last + 0.2 * seconds

    def _refused(self, name: str, wait: float) -> None:
        with self._lock:
            self._refusing[name] = time.monotonic() + wait
