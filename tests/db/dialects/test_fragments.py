"""The vendor's fragments of SQL text (``db/dialects/fragments.py``), evaluated by the live database."""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.fragments import SqlFragments
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.publisher import publish

pytestmark = pytest.mark.django_db(transaction=True)


def _scalar(sql: str, params: list[object] | None = None) -> object:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def test_now_plus_and_now_minus_are_the_database_clock_moved_by_seconds():
    d = get_dialect(connection)
    assert isinstance(d, SqlFragments)
    later, later_params = d.now_plus(3600)
    earlier, earlier_params = d.now_minus(3600)
    now = d.to_datetime(_scalar(f"SELECT {d.now_sql}"))
    plus = d.to_datetime(_scalar(f"SELECT {later}", later_params))
    minus = d.to_datetime(_scalar(f"SELECT {earlier}", earlier_params))
    assert 3590 < (plus - now).total_seconds() < 3610
    assert 3590 < (now - minus).total_seconds() < 3610


def test_quoted_reserved_words_name_the_columns():
    d = get_dialect(connection)
    publish("frag.q", {"n": 1}, key="k", id="one")
    sql = f"SELECT {d.qn('partition')}, {d.qn('key')} FROM queue_messages WHERE topic = %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, ["frag.q"])
        assert cursor.fetchall()[0][1] == "k"


def test_distinct_topics_lists_each_topic_once_in_order():
    d = get_dialect(connection)
    for topic in ("frag.b", "frag.a", "frag.b", "frag.c"):
        publish(topic, {"n": 1})
    # One statement where the vendor has one, else one index dive per topic (MySQL/MariaDB).
    topics = QueueStore("default").log_topics()
    assert [t for t in topics if t.startswith("frag.")] == ["frag.a", "frag.b", "frag.c"]
    with connection.cursor() as cursor:
        if d.distinct_topics_sql is not None:
            cursor.execute(d.distinct_topics_sql)
            assert [row[0] for row in cursor.fetchall()] == topics
        cursor.execute(d.next_topic_sql, ["frag.a"])
        assert [tuple(row) for row in cursor.fetchall()] == [("frag.b",)]
