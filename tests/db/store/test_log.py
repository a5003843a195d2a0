"""store/log.py: the reads of the message log behind the Spark source, stream and JDBC reader,
and the topic list of ``queue_gc`` (``TopicStore.registered_topics``)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.store.log import LOG_COLUMNS, LogFilter, LogStore
from django_sqlqueue.models import Message

from ...support.engine_helpers import publish_to, requires_vendor, store

pytestmark = pytest.mark.django_db(transaction=True)


def log() -> LogStore:
    return LogStore("default")


def test_offset_ranges_are_per_partition_and_only_of_sequenced_messages():
    publish_to("log.a", 0, 5)
    publish_to("log.a", 1, 3)
    publish_to("log.a", 2, 2, seq=False)  # unsequenced: not read
    publish_to("log.b", 0, 4)
    assert log().offset_ranges("log.a", LogFilter()) == [(0, 1, 5), (1, 1, 3)]
    assert log().offset_ranges("log.a", LogFilter(start_offset=2, end_offset=4)) == [(0, 2, 4), (1, 2, 3)]
    assert log().offset_ranges("log.a", LogFilter(partitions=(1,))) == [(1, 1, 3)]
    assert log().offset_ranges("log.none", LogFilter()) == []


def test_offset_ranges_filter_on_published_at():
    publish_to("log.t", 0, 3)
    Message.objects.filter(topic="log.t", offset=1).update(published_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    Message.objects.filter(topic="log.t", offset__gt=1).update(published_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    cutoff = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    assert log().offset_ranges("log.t", LogFilter(start_time=cutoff)) == [(0, 2, 3)]
    assert log().offset_ranges("log.t", LogFilter(end_time=cutoff)) == [(0, 1, 1)]


def test_read_range_pages_through_a_partition_in_offset_order():
    publish_to("log.r", 0, 7, metadata={"m": 1})
    publish_to("log.r", 1, 2)
    rows = list(log().read_range("log.r", 0, 2, 6, LogFilter(), fetch_rows=2))
    assert [r[2] for r in rows] == [2, 3, 4, 5, 6]
    first = dict(zip(LOG_COLUMNS, rows[0], strict=True))
    assert (first["topic"], first["partition"], first["failure_count"]) == ("log.r", 0, 0)
    d = get_dialect(connection)
    assert d.load_json(first["payload"]) == {"p": 0, "i": 2}
    assert d.load_json(first["metadata"]) == {"m": 1}
    assert first["created_at"].utcoffset() == dt.timedelta(0) and first["failed_at"] is None
    assert list(log().read_range("log.r", 0, 8, 9, LogFilter())) == []


def test_head_offsets_are_the_sequenced_heads():
    publish_to("log.h", 0, 4)
    publish_to("log.h", 3, 1)
    heads = log().head_offsets("log.h")
    assert heads[0] == 4 and heads[3] == 1


def test_registered_topics_lists_the_registry_sorted():
    for topic in ("log.z", "log.a"):
        store().register_topic(topic, 2)
    assert [t for t in store().registered_topics() if t.startswith("log.")] == ["log.a", "log.z"]


@requires_vendor("mysql")
def test_seq_bounds_and_the_literal_subquery_of_the_jdbc_reader():
    publish_to("log.j", 0, 3)
    publish_to("log.k", 1, 2)
    publish_to("log.j", 2, 1, seq=False)
    seqs = sorted(
        Message.objects.filter(topic__in=["log.j", "log.k"], offset__isnull=False).values_list("seq", flat=True)
    )
    start = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    bounds = log().seq_bounds(["log.j", "log.k"], ("topic", "offset", "key"), start_time=start)
    assert (bounds.low, bounds.high, bounds.count) == (seqs[0], seqs[-1], 5)
    # Quoted by the dialect, values inlined: the text Spark's JDBC reader runs as it is.
    assert bounds.table_sql.startswith("(SELECT seq, `topic`, `offset`, `key` FROM queue_messages WHERE ")
    assert "'log.j'" in bounds.table_sql and "%s" not in bounds.table_sql
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {bounds.table_sql}")
        assert cursor.fetchone()[0] == 5
    empty = log().seq_bounds(["log.none"], ("topic",))
    assert (empty.low, empty.high, empty.count) == (None, None, 0)


def test_seq_bounds_needs_sql_literals_which_only_mysql_builds():
    if connection.vendor == "mysql":
        assert get_dialect(connection).literal("it's") in ("'it\\'s'", "'it''s'")
    else:
        with pytest.raises(NotImplementedError, match="MySQL/MariaDB only"):
            log().seq_bounds(["log.x"], ("topic",))
