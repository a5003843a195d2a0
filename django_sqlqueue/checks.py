"""System checks for the ``SQLQUEUE`` setting and the queue database.

Ids are stable: ``sqlqueue.E001``-``E007`` come from :func:`conf.validate`;
``sqlqueue.E010`` flags an unsupported database and ``sqlqueue.W001`` a MySQL queue
connection that is not configured for READ COMMITTED.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from . import conf


@checks.register("sqlqueue")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None)
    return [checks.Error(p.msg, hint=p.hint or None, id=p.id) for p in conf.validate(raw)]


@checks.register("sqlqueue")
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None) or {}
    alias = raw.get("DATABASE", conf.DEFAULT_DATABASE) if isinstance(raw, dict) else conf.DEFAULT_DATABASE
    if alias not in settings.DATABASES:
        return []  # reported by sqlqueue.E006
    connection = connections[alias]
    messages: list[checks.CheckMessage] = []
    if connection.vendor not in ("mysql", "postgresql", "sqlite"):
        messages.append(
            checks.Error(
                f"Database {alias!r} uses {connection.vendor!r}; django-sqlqueue supports MySQL/MariaDB, "
                "PostgreSQL and SQLite.",
                id="sqlqueue.E010",
            )
        )
    if connection.vendor == "mysql":
        level = (settings.DATABASES[alias].get("OPTIONS") or {}).get("isolation_level")
        if (level or "").lower() != "read committed":
            messages.append(
                checks.Warning(
                    f"Database {alias!r} (the queue database) runs at {level or 'the server default isolation level'}, "
                    "not READ COMMITTED.",
                    hint="Set DATABASES[alias]['OPTIONS']['isolation_level'] = 'read committed': under REPEATABLE "
                    "READ, gap locks make concurrent consumers deadlock.",
                    id="sqlqueue.W001",
                )
            )
    return messages
