"""db/conn.py: a worker's threads keep healthy connections and drop broken or aged ones.

Each test runs on a thread of its own (the ``spawn`` fixture): its own connection, as a
worker's poll loop or handler thread has, outside the test's transaction.
"""

from __future__ import annotations

import time

import pytest
from django.db import DatabaseError, close_old_connections, connection, transaction

from django_sqlqueue.db.conn import close_all_quietly, close_quietly, tidy_connections

from ..support.engine_helpers import kill_session, not_on_sqlite, session_id

pytestmark = pytest.mark.django_db(transaction=True)


def query() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


def test_a_healthy_connection_is_kept_where_django_would_close_it(spawn) -> None:
    def body() -> tuple[bool, bool]:
        query()
        raw = connection.connection
        tidy_connections()
        kept = connection.connection is raw
        close_old_connections()  # CONN_MAX_AGE 0: Django's per-request rule closes it
        return kept, connection.connection is None

    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    assert spawn(body).join_ok() == (True, True)


def test_after_an_error_a_usable_connection_is_kept_and_its_flag_cleared(spawn) -> None:
    def body() -> tuple[bool, bool]:
        query()
        raw = connection.connection
        with pytest.raises(DatabaseError):
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table_anywhere")
        assert connection.errors_occurred
        tidy_connections()
        return connection.connection is raw, connection.errors_occurred

    assert spawn(body).join_ok() == (True, False)


@not_on_sqlite("the server ends a session: SQLite has no server")
def test_a_broken_connection_is_closed_and_the_next_query_opens_a_new_one(spawn) -> None:
    def body() -> tuple[bool, int]:
        mine = session_id()
        spawn(lambda: kill_session(mine)).join_ok()
        with pytest.raises(DatabaseError):
            query()
        tidy_connections()
        closed = connection.connection is None
        return closed, query()

    assert spawn(body).join_ok() == (True, 1)


@not_on_sqlite("the server ends a session: SQLite has no server")
def test_a_broken_connection_is_closed_quietly_alone_or_with_the_threads_others(spawn) -> None:
    def kill_mine() -> None:
        mine = session_id()
        spawn(lambda: kill_session(mine)).join_ok()
        with pytest.raises(DatabaseError):
            query()

    def body() -> tuple[bool, bool]:
        kill_mine()
        close_quietly(connection.alias)
        closed = connection.connection is None
        assert query() == 1  # the next query opens a new connection
        kill_mine()
        close_all_quietly()  # a thread that ends
        return closed, connection.connection is None

    assert spawn(body).join_ok() == (True, True)


def test_an_aged_connection_is_closed_unless_a_transaction_is_open(spawn) -> None:
    def body() -> tuple[bool, bool]:
        settings = connection.settings_dict
        settings["CONN_MAX_AGE"] = 60
        try:
            query()
            connection.close_at = time.monotonic() - 1  # 60 s have passed
            with transaction.atomic():
                tidy_connections()  # inside a transaction: never
                kept = connection.connection is not None and not connection.closed_in_transaction
            tidy_connections()
            return kept, connection.connection is None
        finally:
            settings["CONN_MAX_AGE"] = 0

    assert spawn(body).join_ok() == (True, True)
