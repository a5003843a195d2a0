"""The recurring schedules' bookkeeping (``queue_schedules``): one row per schedule, its last tick fired.

Written only by the scheduler thread of the workers (``worker/threads/scheduler.py``),
whose docstring tells the whole protocol; here are its three statements. Firing a tick is
one transaction of the scheduler's own (``transaction.atomic``, because the tick's
publish joins it as an outbox write): inside it, :meth:`ScheduleStore.lock_schedule`
locks the schedule's row, the ticks are published, and :meth:`ScheduleStore.set_last_tick`
moves ``last_tick`` past them before the commit. The row lock is what makes a tick fire
exactly once among many workers: a second worker waits on it, then reads the moved
``last_tick``. Times come from the database clock (the caller's ``now``).
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from ...task_models import ScheduleState
from .base import StoreBase


class ScheduleRow(NamedTuple):
    """A schedule's bookkeeping as :meth:`ScheduleStore.lock_schedule` read it."""

    name: str
    #: The latest tick fired (None: the schedule was just registered, nothing fired yet).
    last_tick: dt.datetime | None
    #: When a worker first saw the schedule: a new schedule fires ticks after this moment only.
    created_at: dt.datetime

    @property
    def fired_up_to(self) -> dt.datetime:
        """The moment up to which ticks were handled: the last tick fired, or the registration."""
        return self.last_tick or self.created_at


class ScheduleStore(StoreBase):
    """``queue_schedules``: register a schedule, lock its row, move its last tick."""

    def register_schedule(self, name: str, now: dt.datetime) -> None:
        """Create the schedule's row (no tick fired yet, created ``now``) unless it exists.

        An INSERT that ignores a conflict, outside the firing transaction: two workers
        registering the same schedule at once both succeed, one row is kept.
        """
        ScheduleState.objects.using(self.using).bulk_create(
            [ScheduleState(name=name, last_tick=None, created_at=now, updated_at=now)],
            ignore_conflicts=True,
        )

    def lock_schedule(self, name: str) -> ScheduleRow:
        """Lock the schedule's row (``SELECT ... FOR UPDATE``) until the caller's transaction ends.

        Must run inside the caller's ``transaction.atomic``: the row lock serializes every
        worker's firing of this schedule, so what it returns stays true until the commit.
        """
        state = ScheduleState.objects.using(self.using).select_for_update().get(name=name)
        return ScheduleRow(state.name, state.last_tick, state.created_at)

    def set_last_tick(self, name: str, tick: dt.datetime, now: dt.datetime) -> None:
        """Record ``tick`` as the schedule's last tick fired, in the transaction that locked its row."""
        ScheduleState.objects.using(self.using).filter(name=name).update(last_tick=tick, updated_at=now)
