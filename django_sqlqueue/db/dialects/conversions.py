"""Conversions between Python values and what raw SQL reads and binds, per vendor.

A mixin of :class:`~django_sqlqueue.db.dialects.base.Dialect`: datetimes and JSON as the
drivers return them, parameters as Django would send them, and driver-escaped literals
for SQL text that another client runs (Spark's JDBC reader).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, overload

from .fragments import SqlFragments


class Conversions(SqlFragments):
    """Values in and out of raw SQL."""

    #: Whether a JSON column reads back as compact text (``{"n":5}``, as the publisher
    #: writes it). PostgreSQL's ``jsonb`` prints its own text form (``{"n": 5}``, its own
    #: key order), so a reader that wants the same text on every database compacts it.
    json_text_is_compact = True

    @overload
    def to_datetime(self, value: None) -> None: ...

    @overload
    def to_datetime(self, value: dt.datetime | str) -> dt.datetime: ...

    @overload
    def to_datetime(self, value: dt.datetime | str | None) -> dt.datetime | None: ...

    def to_datetime(self, value: dt.datetime | str | None) -> dt.datetime | None:
        """Convert a datetime read by raw SQL to an aware UTC datetime (None stays None)."""
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)

    def literal(self, value: Any) -> str:
        """Return ``value`` as a SQL literal, escaped by the driver (for SQL text another
        client runs, e.g. Spark's JDBC reader; everything else binds parameters)."""
        raise NotImplementedError(f"SQL literals are built for MySQL/MariaDB only, not {self.connection.vendor}.")

    def load_json(self, value: Any) -> Any:
        """Decode a JSON column read by raw SQL (drivers return text or objects)."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode()
        if isinstance(value, str):
            return {} if value == "{}" else json.loads(value)
        return value

    def adapt_datetime(self, value: dt.datetime | None) -> Any:
        """Convert an aware datetime to the parameter Django would send."""
        return self.connection.ops.adapt_datetimefield_value(value)
