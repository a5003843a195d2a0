"""The vendor differences the package asks the dialect about, instead of testing ``connection.vendor``.

Each property is checked twice: what every vendor's dialect answers, and, on the database
the suite runs on, that the answer is true of that database (a second connection's write
beside an open transaction, the text of a JSON column, a listener connection's setup).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from django_sqlqueue.db.dialects import get_dialect
from django_sqlqueue.db.dialects.base import Dialect, MessageRow
from django_sqlqueue.db.dialects.mysql import MySQLDialect
from django_sqlqueue.db.dialects.postgresql import PostgreSQLDialect
from django_sqlqueue.db.dialects.sqlite import SQLiteDialect
from django_sqlqueue.publisher import publish


@pytest.mark.parametrize(
    ("dialect", "notify", "concurrent_writers", "compact_json"),
    [
        (MySQLDialect, False, True, True),
        (PostgreSQLDialect, True, True, False),
        (SQLiteDialect, False, False, True),
    ],
)
def test_each_vendor_answers_for_itself(
    dialect: type[Dialect], notify: bool, concurrent_writers: bool, compact_json: bool
) -> None:
    assert dialect.supports_notify is notify
    assert dialect.concurrent_writers is concurrent_writers
    assert dialect.json_text_is_compact is compact_json
    # Only a vendor with notifications knows how to set a listener's connection up.
    assert (dialect.start_listening is not Dialect.start_listening) is notify


def row(id: str) -> MessageRow:
    return MessageRow(partition=0, key="", id=id, payload_json='{"n":1}', metadata_json="{}")


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_is_whether_a_second_connection_writes_beside_an_open_transaction() -> None:
    """An INSERT on another thread's connection while this thread's transaction has written:
    it completes at once with row locks, and waits for the commit on SQLite."""
    dialect = get_dialect(connection)
    written = threading.Event()
    errors: list[BaseException] = []

    def write_on_own_connection() -> None:
        own = connections["default"]  # this thread's own connection
        try:
            with own.cursor() as cursor:
                get_dialect(own).insert_messages(cursor, "dia.w2", [row("b")], skip_duplicates=False)
            written.set()
        except BaseException as exc:  # noqa: BLE001 - asserted on the test's thread
            errors.append(exc)
        finally:
            own.close()

    writer = threading.Thread(target=write_on_own_connection)
    with transaction.atomic():
        with connection.cursor() as cursor:
            dialect.insert_messages(cursor, "dia.w1", [row("a")], skip_duplicates=False)
        writer.start()
        beside = written.wait(2.0)
    writer.join(30)
    assert not errors and written.is_set()  # after the commit, it wrote everywhere
    assert beside is dialect.concurrent_writers


@pytest.mark.django_db(transaction=True)
def test_json_text_is_compact_is_how_a_json_column_reads_back() -> None:
    dialect = get_dialect(connection)
    if connection.vendor == "mysql" and not connection.mysql_is_mariadb:
        pytest.xfail("MySQL's JSON type prints its own form; the dialect answers as for MariaDB's LONGTEXT")
    publish("dia.j", {"n": 5, "a": [1, 2]}, id="j")
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM queue_messages WHERE topic = %s AND id = %s", ["dia.j", "j"])
        (text,) = cursor.fetchone()
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode()
    assert isinstance(text, str)
    assert (text == '{"n":5,"a":[1,2]}') is dialect.json_text_is_compact


@pytest.mark.django_db(transaction=True)
def test_start_listening_names_the_session_and_listens_on_each_channel() -> None:
    dialect = get_dialect(connection)
    if not dialect.supports_notify:
        with pytest.raises(NotImplementedError):
            dialect.start_listening(object(), "sqlqueue-listener w1", ["sqlqueue.dia"])
        return
    import psycopg

    name = "sqlqueue-listener " + "w" * 80
    raw = psycopg.connect(**connection.get_connection_params())
    try:
        raw.autocommit = True
        dialect.start_listening(raw, name, ["sqlqueue.dia-a", "sqlqueue.dia-b"])
        with connection.cursor() as cursor:
            cursor.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [raw.info.backend_pid])
            assert cursor.fetchone()[0] == name[:63]
            cursor.execute("SELECT pg_notify('sqlqueue.dia-b', '3')")
        received = [(n.channel, n.payload) for n in raw.notifies(timeout=5, stop_after=1)]
        assert received == [("sqlqueue.dia-b", "3")]
    finally:
        raw.close()
