"""The sequencer's vendor statements (``db/dialects/sequencing.py``), run on the live database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.sequencing import Sequencing
from django_sqlqueue.models import Message, TopicHour
from django_sqlqueue.publisher import publish

pytestmark = pytest.mark.django_db(transaction=True)


def test_hour_sql_truncates_a_timestamp_to_its_utc_hour():
    d = get_dialect(connection)
    assert isinstance(d, Sequencing)
    publish("seqd.hour", {"n": 1}, id="h")
    Message.objects.filter(topic="seqd.hour").update(published_at=dt.datetime(2026, 5, 6, 7, 48, 9, tzinfo=dt.UTC))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.hour_sql('published_at')} FROM queue_messages WHERE topic = %s", ["seqd.hour"])
        hour = d.to_datetime(cursor.fetchone()[0])
    assert hour == dt.datetime(2026, 5, 6, 7, tzinfo=dt.UTC)


def test_assign_offsets_numbers_only_unsequenced_rows_and_count_sequenced_adds_them_up():
    d = get_dialect(connection)
    for i in range(3):
        publish("seqd.off", {"n": i}, key="k", id=f"m{i}")
    seqs = list(Message.objects.filter(topic="seqd.off").order_by("seq").values_list("seq", flat=True))
    partition = Message.objects.get(topic="seqd.off", id="m0").partition
    with transaction.atomic(), connection.cursor() as cursor:
        assert d.assign_offsets(cursor, [(seqs[0], 1), (seqs[1], 2)]) == 2
        # A row already numbered is not written again: the count says what was written.
        assert d.assign_offsets(cursor, [(seqs[1], 5), (seqs[2], 3)]) == 1
        d.count_sequenced(cursor, "seqd.off", {partition: (1, 3)}, 16)
    offsets = list(Message.objects.filter(topic="seqd.off").order_by("seq").values_list("offset", flat=True))
    assert offsets == [1, 2, 3]
    assert sum(TopicHour.objects.filter(topic="seqd.off").values_list("messages", flat=True)) == 3
