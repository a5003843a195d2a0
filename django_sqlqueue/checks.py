"""System checks for the ``SQLQUEUE`` setting and the queue database.

Ids are stable and each means one thing. From :func:`conf.validate`: ``E001`` SQLQUEUE
is not a dict, ``E002`` unknown keys, ``E003`` a bad duration, ``E004`` a bad positive
integer, ``E005`` a bad DLQ suffix, ``E006`` an unknown DATABASE alias, ``E007`` renewal
not below the lease duration, ``E008`` a lower bound above its upper bound, ``E009`` a bad
TOPICS entry, ``E011`` a bad SCHEDULES entry, ``E012`` a bad METRICS_TOKEN, ``E013`` a bad
HEALTH threshold. From this module: ``sqlqueue.E010`` flags an unsupported database,
``sqlqueue.W001`` a MySQL queue
connection that is not configured for READ COMMITTED and ``sqlqueue.W002`` a SQLite queue
database whose transactions do not take the write lock at BEGIN.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import load_backend

from . import conf


@checks.register("sqlqueue")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None)
    return [checks.Error(p.msg, hint=p.hint or None, id=p.id) for p in conf.validate(raw)]


@checks.register("sqlqueue")
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    raw = getattr(settings, "SQLQUEUE", None) or {}
    alias = raw.get("DATABASE", conf.DEFAULT_DATABASE) if isinstance(raw, dict) else conf.DEFAULT_DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return []  # reported by sqlqueue.E006
    database = settings.DATABASES[alias]
    # The backend class, not connections[alias]: no connection is opened, and the check reads
    # the settings it is given (override_settings included), whatever engine subclass they name.
    try:
        vendor = load_backend(database.get("ENGINE") or "django.db.backends.dummy").DatabaseWrapper.vendor
    except (ImproperlyConfigured, ImportError):
        return []  # Django itself reports a backend it cannot load
    options = database.get("OPTIONS") or {}
    messages: list[checks.CheckMessage] = []
    if vendor not in ("mysql", "postgresql", "sqlite"):
        messages.append(
            checks.Error(
                f"Database {alias!r} uses {vendor!r}; django-sqlqueue supports MySQL/MariaDB, PostgreSQL and SQLite.",
                id="sqlqueue.E010",
            )
        )
    if vendor == "mysql":
        level = options.get("isolation_level")
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
    if vendor == "sqlite":
        mode = options.get("transaction_mode")
        # IMMEDIATE (or EXCLUSIVE, the same in WAL mode) takes the write lock at BEGIN. Under the
        # default DEFERRED, a transaction that read first fails with "database is locked" when
        # it writes while another holds the lock, instead of waiting for it.
        if str(mode or "").upper() not in ("IMMEDIATE", "EXCLUSIVE"):
            messages.append(
                checks.Warning(
                    f"Database {alias!r} (the queue database) is SQLite with transaction_mode "
                    f"{mode or 'DEFERRED (the default)'}, not IMMEDIATE.",
                    hint="Set DATABASES[alias]['OPTIONS']['transaction_mode'] = 'IMMEDIATE': deferred transactions "
                    "fail with 'database is locked' when publishers and workers write at once.",
                    id="sqlqueue.W002",
                )
            )
    return messages
