"""ops/messages.py: browsing the log, newest first, with keyset pages and filters.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.messages import MessageFilter, browse

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_browse_keyset_pages_newest_first():
    build()
    first = browse(MessageFilter(topic="orders"), limit=8)
    second = browse(MessageFilter(topic="orders"), cursor=first.next_cursor, limit=8)
    third = browse(MessageFilter(topic="orders"), cursor=second.next_cursor, limit=8)
    ids = [m.id for m in first.items + second.items + third.items]
    assert ids == [f"o{i}" for i in range(19, -1, -1)] and third.next_cursor is None


def test_browse_filters():
    build()
    by_key = browse(MessageFilter(topic="orders", key="k1"))
    assert {m.id for m in by_key.items} == {f"o{i}" for i in range(0, 20, 4)}
    assert [m.id for m in browse(MessageFilter(topic="orders", id="o5")).items] == ["o5"]
    p0 = browse(MessageFilter(topic="orders", partition=0)).items
    assert p0 and all(m.partition == 0 for m in p0)
    assert browse(MessageFilter(after=timezone.now() + dt.timedelta(minutes=1))).items == []
    assert len(browse(MessageFilter(topic="orders", before=timezone.now() + dt.timedelta(minutes=1))).items) == 20
    assert browse(MessageFilter(topic="orders", before=timezone.now() - dt.timedelta(minutes=1))).items == []
    with pytest.raises(OperationError, match="needs a topic"):
        browse(MessageFilter(id="o5"))


def test_browse_reads_no_count_and_no_distinct():
    build()
    with CaptureQueriesContext(connection) as queries:
        browse(MessageFilter(topic="orders", key="k2"), limit=5)
    sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
    assert "COUNT(" not in sql and "DISTINCT" not in sql
