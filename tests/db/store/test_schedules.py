"""ScheduleStore (``store/schedules.py``): the recurring schedules' bookkeeping rows, with the
database clock. How the scheduler thread uses them (one transaction per firing) is tested in
tests/worker/threads/test_scheduler.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError

from django_sqlqueue.db.store.schedules import ScheduleRow
from django_sqlqueue.task_models import ScheduleState

from ...support.engine_helpers import not_on_sqlite, store

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_schedule_is_registered_once_and_fires_from_its_first_sighting():
    s = store()
    first = s.now()
    s.register_schedule("nightly", first)
    s.register_schedule("nightly", first + dt.timedelta(hours=1))  # another worker, later: ignored
    with transaction.atomic():
        state = s.lock_schedule("nightly")
    assert state == ScheduleRow("nightly", None, first)
    assert state.fired_up_to == first
    assert ScheduleState.objects.count() == 1


def test_the_last_tick_moves_in_the_transaction_that_locked_the_row():
    s = store()
    now = s.now()
    s.register_schedule("hourly", now - dt.timedelta(hours=3))
    tick = now.replace(minute=0, second=0, microsecond=0)
    with transaction.atomic():
        assert s.lock_schedule("hourly").last_tick is None
        s.set_last_tick("hourly", tick, now)
    with transaction.atomic():
        state = s.lock_schedule("hourly")
    assert (state.last_tick, state.fired_up_to) == (tick, tick)
    assert ScheduleState.objects.get(name="hourly").updated_at == now


@not_on_sqlite("no row locks: the write lock taken at BEGIN serializes the firing transactions")
def test_locking_needs_the_callers_transaction():
    s = store()
    s.register_schedule("loose", s.now())
    with pytest.raises(TransactionManagementError):
        s.lock_schedule("loose")  # SELECT ... FOR UPDATE in autocommit would lock nothing
