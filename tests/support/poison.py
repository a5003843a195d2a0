"""Rows no ``publish()`` writes: raw SQL, as another program (or a hand-written UPDATE) would.

``publish()`` stores only JSON it encoded itself, with an object as metadata. What the
database lets through depends on the vendor (Django's ``JSONField`` column):

- **MariaDB**: ``JSON`` is ``LONGTEXT`` with ``CHECK (json_valid(...))``, which a session
  can switch off (``check_constraint_checks = 0``): any text can be stored;
- **MySQL 8**: a native ``JSON`` type: only valid JSON;
- **PostgreSQL**: ``jsonb``: only valid JSON (and no ``\\u0000`` nor lone surrogates);
- **SQLite**: ``text`` with ``CHECK (JSON_VALID(...))``, off with
  ``PRAGMA ignore_check_constraints``: any text can be stored.

Valid JSON that Python cannot decode is possible everywhere: an integer of more digits
than ``sys.get_int_max_str_digits()``, metadata that is an array, a string or null.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from tests.support.engine_helpers import execute

#: Valid JSON on every database, refused by Python's int() (4300 digits by default).
HUGE_INTEGER = "1" * 5000


def accepts_invalid_json() -> bool:
    """Whether this database can be made to store text that is not JSON in a JSON column."""
    return connection.vendor == "sqlite" or (connection.vendor == "mysql" and connection.mysql_is_mariadb)


def invalid_json_refused_reason() -> str:
    return {
        "postgresql": "PostgreSQL's jsonb stores only valid JSON: a row with invalid JSON cannot exist",
        "mysql": "MySQL's native JSON type stores only valid JSON: a row with invalid JSON cannot exist",
    }.get(connection.vendor, f"{connection.vendor} refuses invalid JSON")


@contextmanager
def unchecked() -> Iterator[None]:
    """Switch off the JSON CHECK constraints of this connection for the block (MariaDB, SQLite)."""
    if not accepts_invalid_json():
        pytest.skip(invalid_json_refused_reason())
    on, off = (
        ("PRAGMA ignore_check_constraints = ON", "PRAGMA ignore_check_constraints = OFF")
        if connection.vendor == "sqlite"
        else ("SET SESSION check_constraint_checks = 0", "SET SESSION check_constraint_checks = 1")
    )
    execute(on)
    try:
        yield
    finally:
        execute(off)


def store_raw(topic: str, message_id: str, column: str, text: str) -> None:
    """Overwrite a stored message's ``payload`` or ``metadata`` column with ``text`` (JSON or not)."""
    assert column in ("payload", "metadata")
    value = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    assert (
        execute(f"UPDATE queue_messages SET {column} = {value} WHERE topic = %s AND id = %s", [text, topic, message_id])
        == 1
    )


def store_invalid(topic: str, message_id: str, column: str, text: str = "{not json") -> None:
    """Store text that is not JSON in a column; skips the test where the database refuses it."""
    with unchecked():
        store_raw(topic, message_id, column, text)
