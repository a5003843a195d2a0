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


# -- pages filtered by partition or key: windows of the log, at most SCAN_SPAN per call ---------


def _every_page(f: MessageFilter, limit: int) -> tuple[list[str], int]:
    """The ids of every page of ``f``, following the cursors; and how many pages were short."""
    ids: list[str] = []
    cursor, short = None, 0
    for _ in range(1_000):
        page = browse(f, cursor=cursor, limit=limit)
        ids += [m.id for m in page.items]
        short += page.scanned_to is not None
        assert len(page.items) <= limit
        if page.next_cursor is None:
            return ids, short
        assert page.next_cursor < (cursor or 10**18)  # always downwards: no page read twice
        cursor = page.next_cursor
    raise AssertionError("the cursors never reached the end of the topic")


def test_a_rare_key_is_found_page_by_page_within_the_scan_span(monkeypatch):
    from django_sqlqueue import publish_many
    from django_sqlqueue.ops import messages

    monkeypatch.setattr(messages, "SCAN_SPAN", 40)
    # The key's messages at both ends of 300 others of the same topic (and 100 of another).
    publish_many("orders", [{"payload": {}, "key": "rare", "id": f"r{i}"} for i in range(3)])
    publish_many("orders", [{"payload": {}, "key": f"x{i % 7}"} for i in range(300)])
    publish_many("typo", [{"payload": {}} for _ in range(100)])
    publish_many("orders", [{"payload": {}, "key": "rare", "id": f"r{i}"} for i in range(3, 5)])

    first = browse(MessageFilter(topic="orders", key="rare"), limit=10)
    assert [m.id for m in first.items] == ["r4", "r3"]
    assert first.scanned_to is not None and first.next_cursor == first.scanned_to  # short, and goes on
    ids, short = _every_page(MessageFilter(topic="orders", key="rare"), limit=10)
    assert ids == ["r4", "r3", "r2", "r1", "r0"] and short >= 300 // 40
    # Without a topic, the key is looked for along the primary key, in the same windows.
    assert _every_page(MessageFilter(key="rare"), limit=2)[0] == ids


def test_a_partition_read_page_by_page_is_the_partition_newest_first():
    from django_sqlqueue import publish_many
    from django_sqlqueue.models import Message

    build()
    publish_many("orders", [{"payload": {"n": i}, "key": f"k{i % 5}"} for i in range(200)])
    want = list(Message.objects.filter(topic="orders", partition=1).order_by("-seq").values_list("id", flat=True))
    assert len(want) > 50
    assert _every_page(MessageFilter(topic="orders", partition=1), limit=7) == (want, 0)
    cutoff = Message.objects.filter(topic="orders").order_by("seq").values_list("published_at", flat=True)[100]
    later = list(
        Message.objects.filter(topic="orders", partition=1, published_at__gte=cutoff)
        .order_by("-seq")
        .values_list("id", flat=True)
    )
    assert _every_page(MessageFilter(topic="orders", partition=1, after=cutoff), limit=7)[0] == later
    with pytest.raises(OperationError, match="needs a topic"):
        browse(MessageFilter(partition=1))
