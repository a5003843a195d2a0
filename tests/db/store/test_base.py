"""StoreBase (``store/base.py``): the plumbing every store module stands on, on a real database.

The engine's short transactions (lean ``START TRANSACTION`` ... ``COMMIT`` on MySQL/MariaDB,
``atomic()`` elsewhere or inside a caller's transaction), the quoting of the reserved column
names, the ``(partition, offset)`` match of the acks and redeliveries, and the lease fence.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from django_sqlqueue.db.store.base import StoreBase
from django_sqlqueue.models import Topic

from .helpers import A, B, C, G, T, deliver, fill, leased

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def base() -> StoreBase:
    return StoreBase("default")


def register(s: StoreBase, cursor: Any, topic: str) -> None:
    """A write through the transaction's cursor (a row of the topic registry)."""
    now = s.dialect.now_sql
    cursor.execute(
        f"INSERT INTO queue_topics (topic, partitions, created_at, updated_at) VALUES (%s, NULL, {now}, {now})",
        [topic],
    )


def statements(seen: list[str]) -> Any:
    """Record the first word of each statement this thread's connection runs (once connected)."""
    connection.ensure_connection()

    def record(execute, sql, params, many, context):
        seen.append(sql.split()[0].upper() if sql.strip() else sql)
        return execute(sql, params, many, context)

    return connection.execute_wrapper(record)


def test_a_transaction_commits_on_success_and_rolls_back_on_an_error():
    s = base()
    seen: list[str] = []
    with statements(seen):
        with s.transaction() as cursor:
            register(s, cursor, "kept")
            # MySQL/MariaDB: the engine's own transaction on the autocommit connection, no
            # atomic() (whose SET autocommit statements cost a sixth of a batch's statements).
            assert connection.in_atomic_block is not s.dialect.lean_transactions
        with pytest.raises(Boom), s.transaction() as cursor:
            register(s, cursor, "undone")
            raise Boom
    assert list(Topic.objects.values_list("topic", flat=True)) == ["kept"]
    assert connection.get_autocommit() and not connection.in_atomic_block
    if s.dialect.lean_transactions:
        assert seen == ["START", "INSERT", "COMMIT", "START", "INSERT", "ROLLBACK"]
    else:
        assert "START" not in seen and "COMMIT" not in seen  # atomic() commits through the driver


def test_a_transaction_inside_the_callers_joins_it_and_goes_with_its_rollback():
    s = base()
    seen: list[str] = []
    with pytest.raises(Boom), transaction.atomic():
        with statements(seen), s.transaction() as cursor:
            register(s, cursor, "joined")
        assert Topic.objects.filter(topic="joined").exists()  # not committed, visible to the caller
        raise Boom
    assert "START" not in seen and "COMMIT" not in seen
    assert not Topic.objects.exists()


def test_reserved_column_names_are_quoted_for_the_vendor():
    fill(A, 2)
    s = base()
    rows = s._fetchall(f"SELECT {s.P}, {s.OFF} FROM queue_messages WHERE topic = %s ORDER BY {s.OFF}", [T])
    assert [tuple(r) for r in rows] == [(A, 1), (A, 2)]


def test_match_offsets_selects_exactly_the_given_pairs_grouped_by_partition():
    fill(A, 4)
    fill(B, 4)
    deliver(A, [1, 2, 3, 4])
    deliver(B, [1, 2, 3, 4])
    s = base()
    keys = [(B, 3), (A, 4), (A, 1), (C, 1), (B, 9)]
    match, params = s.match_offsets(keys)
    assert params == [A, 1, 4, B, 3, 9, C, 1]  # sorted: statements list keys in one order
    assert match.count(" OR ") == 2  # one index range per partition, no row constructor
    found = s._fetchall(
        f"SELECT {s.P}, message_offset FROM queue_delivery_state WHERE consumer_group = %s AND topic = %s "
        f"AND {match} ORDER BY {s.P}, message_offset",
        [G, T, *params],
    )
    assert [tuple(r) for r in found] == [(A, 1), (A, 4), (B, 3)]


def test_lock_held_returns_only_the_partitions_still_leased_by_the_name():
    for p in (A, B, C):
        fill(p, 1)
    leased(A, "w1")
    leased(B, "w1")
    leased(C, "w2")
    leased(A, "w1", group="analytics")
    s = base()
    with s.transaction() as cursor:
        assert s.lock_held(cursor, G, T, "w1", [C, B, A, B]) == {A, B}
        assert s.lock_held(cursor, G, T, "w2", [A, B]) == set()
        assert s.lock_held(cursor, "analytics", T, "w1", [A, B]) == {A}
        assert s.lock_held(cursor, G, T, "w1", []) == set()
