"""Conversions between Python values and raw SQL (``db/dialects/conversions.py``), on the live database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.conversions import Conversions

pytestmark = pytest.mark.django_db(transaction=True)


def test_to_datetime_returns_aware_utc_and_keeps_none():
    d = get_dialect(connection)
    assert d.to_datetime(None) is None
    assert d.to_datetime("2026-01-31 12:00:00") == dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
    assert d.to_datetime(dt.datetime(2026, 1, 31, 14, tzinfo=dt.timezone(dt.timedelta(hours=2)))) == dt.datetime(
        2026, 1, 31, 12, tzinfo=dt.UTC
    )


def test_the_database_clock_read_raw_converts_to_aware_utc_near_now():
    d = get_dialect(connection)
    assert isinstance(d, Conversions)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql}", [])  # params: the vendor text doubles its %
        now = d.to_datetime(cursor.fetchone()[0])
    assert now is not None and now.tzinfo is not None
    assert abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 60


def test_a_bound_datetime_round_trips_through_the_database():
    d = get_dialect(connection)
    when = dt.datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=dt.UTC)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.datetime_placeholder}", [d.adapt_datetime(when)])
        assert d.to_datetime(cursor.fetchone()[0]).replace(microsecond=0) == when.replace(microsecond=0)
