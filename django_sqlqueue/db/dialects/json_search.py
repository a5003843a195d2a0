"""The console's payload search: "the JSON value at this path equals this scalar", per vendor.

Django's key lookups (``payload__order_id=42``) are not exact on every database: on
MySQL/MariaDB they compare unquoted text (``42`` matches ``"42"``, and ``42`` misses a
stored ``42.0``) and on SQLite ``true`` matches the string ``"true"``. The conditions here
compare the JSON *type* first, then the value:

- numbers match numbers of equal value (``42`` matches ``42`` and ``42.0``, never ``"42"``);
- strings match strings, byte for byte (no collation folding case or accents);
- ``true``/``false``/``null`` match only the JSON literal (a missing key is not ``null``).

The condition is a plain expression on the row's ``payload`` column: it is evaluated on the
rows the rest of the query reads (a ``seq`` range of the primary key or of the (topic, seq)
index, ``ops/search.py``) and never chooses an index of its own. No locks: plain reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Func, IntegerField

#: What the search compares with: one JSON scalar.
JsonScalar = str | int | float | bool | None


def payload_match(
    connection: BaseDatabaseWrapper, column: str, path: Sequence[str], value: JsonScalar
) -> tuple[str, list[Any]]:
    """Return SQL (and its parameters) true where the JSON at ``path`` of ``column`` equals ``value``.

    ``column`` is the quoted column (``"queue_messages"."payload"``); ``path`` its keys, each
    an identifier (checked by the caller: they are bound as parameters all the same).
    """
    vendor = connection.vendor
    if vendor == "postgresql":
        # jsonb equality is typed and numeric-aware: '42'::jsonb = '42.0'::jsonb, <> '"42"'.
        return f"({column} #> %s) = %s::jsonb", [list(path), json.dumps(value)]
    json_path = "$" + "".join(f'."{key}"' for key in path)
    if vendor == "mysql":
        return _mysql(f"JSON_EXTRACT({column}, %s)", json_path, value)
    if vendor == "sqlite":
        return _sqlite(column, json_path, value)
    raise NotImplementedError(f"payload search on {vendor!r}")


def _mysql(extract: str, json_path: str, value: JsonScalar) -> tuple[str, list[Any]]:
    kind = f"JSON_TYPE({extract})"
    text = f"JSON_UNQUOTE({extract})"
    if value is None:
        return f"{kind} = 'NULL'", [json_path]
    if isinstance(value, bool):
        return f"({kind} = 'BOOLEAN' AND {text} = %s)", [json_path, json_path, "true" if value else "false"]
    if isinstance(value, int | float):
        # DECIMAL(65, 30) holds every 64-bit integer exactly (a DOUBLE would not); a float is
        # sent as its shortest text (0.1, not the binary 0.1000000000000000055...), as stored.
        numeric = "('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE', 'DECIMAL')"
        equal = f"CAST({text} AS DECIMAL(65, 30)) = CAST(%s AS DECIMAL(65, 30))"
        return f"({kind} IN {numeric} AND {equal})", [json_path, json_path, repr(value)]
    # Bytes, not the connection's collation: "ABC" is not "abc".
    return (
        f"({kind} = 'STRING' AND CAST({text} AS BINARY) = CAST(%s AS BINARY))",
        [json_path, json_path, value],
    )


def _sqlite(column: str, json_path: str, value: JsonScalar) -> tuple[str, list[Any]]:
    # json_type() is NULL for a missing path and 'null' for a JSON null.
    kind = f"json_type({column}, %s)"
    if value is None:
        return f"{kind} = 'null'", [json_path]
    if isinstance(value, bool):
        return f"{kind} = %s", [json_path, "true" if value else "false"]
    extract = f"json_extract({column}, %s)"
    if isinstance(value, int | float):
        return f"({kind} IN ('integer', 'real') AND {extract} = %s)", [json_path, json_path, value]
    return f"({kind} = 'text' AND {extract} = %s)", [json_path, json_path, value]


class OctetLength(Func):
    """Bytes of a column's stored text (a JSON column's size, without sending it)."""

    output_field = IntegerField()
    function = "OCTET_LENGTH"

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="octet_length(CAST(%(expressions)s AS text))", **extra)

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function="LENGTH", **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="length(CAST(%(expressions)s AS BLOB))", **extra)
