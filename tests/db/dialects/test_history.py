"""The history's statements (django_sqlqueue/db/dialects/history.py) on the real database:
minutes since the epoch in UTC, and a sample's upsert that never lowers a running total."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.history import TOTALS
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


def test_a_sample_keeps_the_larger_totals_and_the_last_lag():
    d = get_dialect(connection)
    assert TOTALS == ("published", "handled", "failed", "retried", "dead_lettered")
    with connection.cursor() as cursor:
        d.store_sample(cursor, [("g", "t", [10, 5, 1, 1, 0], 70), ("g", "u", [1, 1, 1, 1, 1], 0)])
        d.store_sample(cursor, [("g", "t", [12, 4, 1, 2, 0], 30)])
    row = HistoryMinute.objects.get(consumer_group="g", topic="t")
    assert (row.published, row.handled, row.failed, row.retried, row.dead_lettered, row.lag) == (12, 5, 1, 2, 0, 30)
    assert HistoryMinute.objects.count() == 2
