"""Vendor-specific SQL, one module per database, chosen by ``connection.vendor``.

Everything the engine cannot express portably through the ORM lives in a
:class:`~django_sqlqueue.db.dialects.base.Dialect` subclass, with a comment on the locks
each statement takes; so does every other vendor difference the package acts on
(notifications, concurrent writers, JSON text): code outside this folder asks the dialect
instead of testing ``connection.vendor``. ``Dialect`` combines one mixin per concern
(``fragments``, ``conversions``, ``inserts``, ``sequencing``, ``sessions``; see
``base.py``). Modules here import only Django's database layer, the standard library and
``django_sqlqueue.exceptions``.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from ...exceptions import UnsupportedDatabase
from .base import Dialect


def get_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    """Return the dialect for a Django connection (one per connection object, reused)."""
    cached = connection.__dict__.get("_sqlqueue_dialect")
    if cached is not None:
        return cached
    dialect = _new_dialect(connection)
    connection.__dict__["_sqlqueue_dialect"] = dialect
    return dialect


def _new_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    vendor = connection.vendor
    if vendor == "mysql":
        from .mysql import MySQLDialect

        return MySQLDialect(connection)
    if vendor == "postgresql":
        from .postgresql import PostgreSQLDialect

        return PostgreSQLDialect(connection)
    if vendor == "sqlite":
        from .sqlite import SQLiteDialect

        return SQLiteDialect(connection)
    raise UnsupportedDatabase(
        f"django-sqlqueue supports MySQL/MariaDB, PostgreSQL and SQLite, not {vendor!r} "
        f"(database alias {connection.alias!r})."
    )


__all__ = ["Dialect", "get_dialect"]
