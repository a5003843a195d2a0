"""Plumbing shared by the operator services: the queue connection, raw SQL, the DB clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings
from ..dialects import Dialect, get_dialect
from ..exceptions import SQLQueueError


class OperationError(SQLQueueError, ValueError):
    """An operator action was refused (bad input, or unsafe in the current state); nothing was written."""


class NotFound(OperationError):
    """The group, topic, partition or dead letter named by an operator does not exist."""


def alias(using: str | None = None) -> str:
    return using or get_settings().DATABASE


def connection(using: str | None = None) -> BaseDatabaseWrapper:
    return connections[alias(using)]


def dialect(using: str | None = None) -> Dialect:
    return get_dialect(connection(using))


def qn(name: str, using: str | None = None) -> str:
    return connection(using).ops.quote_name(name)


def fetchall(sql: str, params: Sequence[Any] = (), using: str | None = None) -> list[tuple[Any, ...]]:
    with connection(using).cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def execute(sql: str, params: Sequence[Any] = (), using: str | None = None) -> int:
    with connection(using).cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def db_now(using: str | None = None) -> dt.datetime:
    """The database's current time (leases and heartbeats are stamped with it)."""
    d = dialect(using)
    ((value,),) = fetchall(f"SELECT {d.now_sql}", using=using)
    return d.to_datetime(value)  # type: ignore[return-value]


def in_list(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def capped_count(sql: str, params: Sequence[Any], cap: int, using: str | None = None) -> int:
    """``COUNT(*)`` of a SELECT, reading at most ``cap + 1`` rows (so it stays bounded)."""
    ((count,),) = fetchall(f"SELECT COUNT(*) FROM ({sql} LIMIT {int(cap) + 1}) capped", params, using)
    return int(count)


def first_line(error: str | None) -> str:
    """The headline of a stored error ("module.Class: message"), without the traceback."""
    return (error or "").split("\n", 1)[0]
