"""Firing recurring schedules: a small thread in every ``runconsumer`` worker.

**Exactly once per tick, structurally.** Each schedule has a row in ``queue_schedules``
holding the last tick fired. A worker fires ticks only inside one transaction that

1. locks that row (``SELECT ... FOR UPDATE``),
2. computes the ticks after ``last_tick`` up to the database clock's *now*,
3. publishes each tick (the task's message or the scheduled message) -- the publish joins
   this transaction (outbox; a message topic routed to another database commits just
   before it, in a transaction there, see :func:`fire`), and
4. moves ``last_tick`` to the last tick fired, then commits.

Another worker wanting the same tick waits on the row lock and then finds ``last_tick``
already past it. A worker dying mid-transaction rolls back both the publish and the
move. As a second guard the tick's message id is deterministic,
``schedule:<name>:<tick>``, and publishing is idempotent on (topic, id). The statements
on ``queue_schedules`` (register, lock, move ``last_tick``) are the data layer's
(``db/store/schedules.py``); this thread owns the transaction, which the publish joins.

**Missed ticks.** Ticks are computed from ``last_tick``, so ticks that passed while every
worker was down fire when a worker is back, each once, late -- if they are at most
``catch_up`` seconds old (default 300). Older missed ticks are skipped and logged (a
warning with their count): like Solid Queue, which does not run missed recurring
tasks, and unlike Celery beat, which runs a missed schedule once at start-up; a bounded
window of catch-up lies in between. A new schedule fires from its first tick after it was
first seen by a worker.

Each worker checks every ``interval`` seconds (1 s) but only touches the database when
its last view says a tick is due; after another worker fired that tick, the transaction
finds nothing to do and refreshes the view. So ``W`` workers cost about ``W`` short
transactions per tick.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from typing import Any

from django.db import transaction
from django.utils.module_loading import import_string

from ...conf import DEFAULT_OUTAGE_REPORT_INTERVAL, get_settings
from ...db.store import QueueStore
from ...publisher import publish
from ...schedules import Schedule
from ..outage import OutageReporter
from .service import ServiceThread

logger = logging.getLogger(__name__)

#: Seconds between a worker's checks for due ticks.
CHECK_INTERVAL = 1.0
#: Seconds a stopping worker waits for a scheduler pass in progress.
STOP_TIMEOUT = 10.0


class Scheduler(ServiceThread):
    """Fires due ticks of ``schedules`` on its own thread (or synchronously: :meth:`run_once`)."""

    thread_name = "sqlqueue-scheduler"
    title = "scheduler"

    def __init__(
        self,
        schedules: list[Schedule],
        *,
        using: str,
        interval: float = CHECK_INTERVAL,
        outage: OutageReporter | None = None,
    ) -> None:
        super().__init__(
            using=using,
            outage=outage or OutageReporter(alias=using, report_interval=DEFAULT_OUTAGE_REPORT_INTERVAL),
            stop_timeout=STOP_TIMEOUT,
        )
        self.schedules = schedules
        self.interval = interval
        self.store = QueueStore(using)
        self._next: dict[str, dt.datetime] = {}

    def body(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - reported by the outage reporter
                self.failed(exc, "scheduler pass failed")
            else:
                self.outage.reachable()
            self.stop_event.wait(self.interval)

    def run_once(self) -> dict[str, int]:
        """Fire every due tick now; return the ticks fired per schedule name."""
        now = self.store.now()
        fired: dict[str, int] = {}
        for schedule in self.schedules:
            due = self._next.get(schedule.name)
            if due is not None and due > now:
                continue
            fired[schedule.name] = self.fire_due(schedule, now)
        return fired

    def fire_due(self, schedule: Schedule, now: dt.datetime) -> int:
        """The transaction described in the module docstring; returns how many ticks it fired."""
        self.store.register_schedule(schedule.name, now)
        skipped: list[dt.datetime] = []
        with transaction.atomic(using=self.using):
            # The row lock serializes every worker's firing of this schedule: a second
            # worker waits here, then reads the last_tick this transaction moved.
            state = self.store.lock_schedule(schedule.name)
            start = state.fired_up_to
            floor = now - dt.timedelta(seconds=schedule.catch_up)
            if start < floor:
                skipped = schedule.ticks(start, floor)
                start = skipped[-1] if skipped else start
                if len(skipped) >= 10_000:  # a very long outage: jump to the window
                    start = floor
            due = schedule.ticks(start, now)
            # Each publish joins this transaction (outbox): it commits with the move of
            # last_tick below, or rolls back with it.
            for tick in due:
                fire(schedule, tick, using=self.using)
            last = due[-1] if due else (skipped[-1] if skipped else None)
            if last is not None:
                self.store.set_last_tick(schedule.name, last, now)
            view = state.fired_up_to if last is None else last
        if skipped:
            logger.warning(
                "schedule %s: skipped %s missed tick(s) older than its catch-up window of %gs (%s .. %s)",
                schedule.name,
                f"{len(skipped)}+" if len(skipped) >= 10_000 else len(skipped),
                schedule.catch_up,
                skipped[0].isoformat(),
                skipped[-1].isoformat(),
            )
        for tick in due:
            logger.info("schedule %s fired tick %s", schedule.name, tick.isoformat())
        upcoming = schedule.ticks(view, view + dt.timedelta(days=400), limit=1)
        self._next[schedule.name] = upcoming[0] if upcoming else now + dt.timedelta(days=1)
        return len(due)


def fire(schedule: Schedule, tick: dt.datetime, *, using: str) -> Any:
    """Publish one tick: enqueue the task, or publish the message, with the tick's id."""
    tick_id = schedule.tick_id(tick)
    if schedule.topic is not None:
        message = functools.partial(
            publish,
            schedule.topic,
            schedule.payload,
            key=schedule.key,
            id=tick_id,
            metadata={"schedule": schedule.name, "tick": tick.isoformat()},
        )
        routed = get_settings().database_for(schedule.topic)
        if routed == using:
            return message()  # joins the tick's transaction (outbox)
        # A topic routed to another database (SQLQUEUE["TOPIC_DATABASES"]) cannot join the
        # tick's transaction: the message commits first, in a transaction of its own database,
        # then the tick's transaction moves last_tick. A crash between the two fires the tick
        # again, and its id (the tick's) makes that second publish store nothing: still once.
        with transaction.atomic(using=routed):
            return message()
    task = import_string(schedule.task)  # type: ignore[arg-type]
    backend = task.get_backend()
    # The sqlqueue tasks backend can publish in this transaction (duck-typed, so the engine
    # does not import the optional tasks layer).
    enqueue_with = getattr(backend, "enqueue_with", None)
    if enqueue_with is None:
        # Another backend cannot join this transaction: at-least-once at best.
        logger.warning(
            "schedule %s: task %s is not on SQLQueueBackend; enqueued outside the tick's transaction",
            schedule.name,
            schedule.task,
        )
        return task.enqueue(*schedule.args, **schedule.kwargs)
    return enqueue_with(task, schedule.args, schedule.kwargs, id=tick_id)
