"""The history's statements (django_sqlqueue/db/dialects/history.py) on the real database:
minutes since the epoch in UTC whatever the session's time zone, and upserts that add."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.history import COUNTERS
from django_sqlqueue.models import HistoryMinute, Message

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_minute_of_a_stored_datetime_is_minutes_since_the_epoch_utc():
    d = get_dialect(connection)
    at = dt.datetime(2026, 3, 29, 1, 59, 59, 999_000, tzinfo=dt.UTC)  # a DST night in Europe
    Message.objects.create(
        topic="t", partition=0, key="k", id="m", payload={}, metadata={}, published_at=at, deliver_at=at, created_at=at
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.minute_sql(d.qn('published_at'))} FROM queue_messages WHERE id = %s", ["m"])
        (minute,) = cursor.fetchone()
    assert int(minute) == int(at.timestamp()) // 60


def test_counts_add_up_per_slot_and_the_lag_sample_overwrites():
    d = get_dialect(connection)
    assert COUNTERS == ("handled", "failed", "retried", "dead_lettered")
    for counts in ([1, 2, 3, 4], [10, 0, 0, 1]):
        with transaction.atomic(), connection.cursor() as cursor:
            d.count_history(cursor, {("g", "t", 1): counts, ("g", "t", 0): [5, 0, 0, 0]})
    rows = {r.slot: r for r in HistoryMinute.objects.filter(consumer_group="g", topic="t")}
    assert (rows[1].handled, rows[1].failed, rows[1].retried, rows[1].dead_lettered) == (11, 2, 3, 5)
    assert rows[0].handled == 10 and rows[0].lag is None
    with connection.cursor() as cursor:
        d.sample_lag(cursor, [("g", "t", 70)])
        d.sample_lag(cursor, [("g", "t", 30)])
    row = HistoryMinute.objects.get(consumer_group="g", topic="t", slot=0)
    assert (row.lag, row.handled) == (30, 10)  # the last sample; the counts untouched
