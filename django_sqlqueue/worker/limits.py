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
statement*, spreading their delays one interval apart (a rate's emission interval; for a
concurrency limit of ``n``, the average run time its attempts took here, divided by ``n``):
with a backlog of hundreds of limited tasks, each admission costs a few statements, not
one per waiting message, and the waiting ones come back about when they can run.
This only ever refuses more, never admits: the database decides every admission.

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
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..rules.rates import Limits, limit_name, parse_rate

if TYPE_CHECKING:
    from ..consumers import ReceivedMessage
    from ..db.retry import Retrying
    from ..db.store import QueueStore
    from .batch.outcomes import Outcomes
    from .subscription import Subscription

logger = logging.getLogger(__name__)

#: Seconds a full concurrency limit is taken as full by this process without asking again,
#: and the base of the delay of a delivery that waits for a slot (spread 0.5x to 1.5x).
FULL_FOR = 0.05
CONCURRENCY_RECHECK = 0.2
#: The shortest wait: a delivery due again sooner would only be refused again.
MIN_WAIT = 0.01


@dataclass(frozen=True)
class Admission:
    """What :meth:`Limiter.admit` decided for one delivery."""

    #: Seconds to wait before the delivery is tried again (None: admitted, run it now).
    wait: float | None = None
    #: The concurrency slot taken ``(name, slot, holder)``, released when the attempt ends.
    slot: tuple[str, int, str] | None = None


ADMITTED = Admission()


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
        #: Limit name -> (monotonic time until which it is known to refuse, deliveries
        #: refused locally since): see "Local knowledge" in the module docstring.
        self._refusing: dict[str, tuple[float, int]] = {}
        self._rng = random.Random()
        #: Concurrency limit name -> a moving average of its attempts' seconds (this process's).
        self._runs: dict[str, float] = {}

    def admit(self, sub: Subscription, received: ReceivedMessage, timeout: float | None) -> Admission:
        """Check the delivery's limits; ``timeout``: its handler's (None: none), for a slot's expiry."""
        limits = limits_of(sub, received)
        if limits is None:
            return ADMITTED
        slot: tuple[str, int, str] | None = None
        if limits.concurrency is not None:
            name, n = limits.concurrency
            wait = self._known_refusal(name, self._runs.get(name, CONCURRENCY_RECHECK) / n)
            if wait is not None:
                return Admission(wait)
            holder = f"{sub.name}:{received.id}:{received.attempt}"[-255:]
            ttl = max(sub.options.visibility_timeout, timeout or 0.0)
            got = self.db("concurrency slot", lambda: self.store.acquire_slot(name, n, holder, ttl))
            if got is None:
                self._refused(name, FULL_FOR)
                return Admission(self._recheck())
            slot = (name, got, holder)
        for name, rate in limits.rates:
            wait = self._known_refusal(name, rate.interval)
            if wait is None:
                wait = self.db("rate limit", partial(self.store.admit_rate, name, rate.interval, rate.burst))
                if wait is not None:
                    self._refused(name, wait)
            if wait is not None:
                if slot is not None:
                    self.release(slot)
                return Admission(max(wait, MIN_WAIT))
        return Admission(None, slot)

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

    def _known_refusal(self, name: str, spacing: float) -> float | None:
        """If ``name`` is known to refuse now, the wait of one more refused delivery (each
        one ``spacing`` after the previous); else None (ask the database)."""
        with self._lock:
            known = self._refusing.get(name)
            if known is None:
                return None
            until, refused = known
            now = time.monotonic()
            if now >= until:
                del self._refusing[name]
                return None
            self._refusing[name] = (until, refused + 1)
        return max(MIN_WAIT, until - now + refused * spacing)

    def _recheck(self) -> float:
        """The wait of a delivery refused a concurrency slot: when one frees is unknown, so
        around :data:`CONCURRENCY_RECHECK`, spread so that the waiting ones do not all return at once."""
        return CONCURRENCY_RECHECK * (0.5 + self._rng.random())

    def _ran(self, name: str, seconds: float) -> None:
        with self._lock:
            last = self._runs.get(name)
            self._runs[name] = seconds if last is None else 0.8 * last + 0.2 * seconds

    def _refused(self, name: str, wait: float) -> None:
        with self._lock:
            self._refusing[name] = (time.monotonic() + wait, 1)
