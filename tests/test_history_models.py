"""The history table's model (django_sqlqueue/history_models.py): one row per (group, topic,
minute), enforced by the database, and its totals default to zero."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from django_sqlqueue import models as queue_models
from django_sqlqueue.history_models import HistoryMinute

pytestmark = pytest.mark.django_db


def test_the_key_is_group_topic_and_minute():
    HistoryMinute.objects.create(consumer_group="g", topic="t", minute=100, handled=2)
    HistoryMinute.objects.create(consumer_group="g", topic="t", minute=101)
    HistoryMinute.objects.create(consumer_group="h", topic="t", minute=100, published=5)
    with pytest.raises(IntegrityError), transaction.atomic():
        HistoryMinute.objects.create(consumer_group="g", topic="t", minute=100)
    row = HistoryMinute.objects.get(consumer_group="g", topic="t", minute=101)
    assert (row.handled, row.failed, row.retried, row.dead_lettered, row.published, row.lag) == (0, 0, 0, 0, 0, 0)
    assert str(row) == "g t @101"


def test_models_reexports_it():
    assert queue_models.HistoryMinute is HistoryMinute
