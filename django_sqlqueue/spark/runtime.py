"""Django inside Spark's Python workers: set up lazily, one alias per connection, closed after use.

Every piece of the data source (planning, ``read()``, ``write()``, the streaming
offsets) runs in a Python worker process that Spark starts, on the driver's machine or
an executor's. Such a process has no Django project: :func:`database` configures a
minimal one on first use (only ``django_sqlqueue`` installed, ``USE_TZ`` on, UTC) -- never
at import, which Spark does while planning -- and registers the connection of the
options under an alias derived from them, so a reused worker can serve jobs against
several databases. A process where Django is already set up (a driver that runs the
code itself) keeps its settings and only gains the alias.

The connection is closed when the block ends: Spark reuses workers between tasks, and an
idle connection held across tasks would outlive MySQL's ``wait_timeout``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .options import Connection

_lock = threading.Lock()
#: Whether this process's Django is the minimal one configured here (a Spark Python worker).
_configured_here = False


def _worker_queue_settings(sqlqueue: dict[str, Any]) -> dict[str, Any]:
    """The ``SQLQUEUE`` of a Spark Python worker: the job's, without ``TOPIC_DATABASES``.

    The worker's Django knows only the alias of the options' connection, which
    ``databases.choose_database`` already picked by the routes in the driver; the routes
    would name aliases it does not have (check E016), and every call here names its alias.
    """
    return {name: value for name, value in sqlqueue.items() if name != "TOPIC_DATABASES"}


def _ensure_django(sqlqueue: dict[str, Any]) -> None:
    global _configured_here
    import django
    from django.apps import apps
    from django.conf import settings

    if not settings.configured:
        _configured_here = True
        settings.configure(
            INSTALLED_APPS=["django_sqlqueue"],
            DATABASES={},
            USE_TZ=True,
            TIME_ZONE="UTC",
            SQLQUEUE=sqlqueue,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        )
    if not apps.ready:
        django.setup()


def _apply_queue_settings(sqlqueue: dict[str, Any]) -> None:
    """Make ``get_settings()`` answer with the job's ``SQLQUEUE`` (a worker runs one task at a time)."""
    from django.conf import settings

    from ..conf import get_settings

    if (getattr(settings, "SQLQUEUE", None) or {}) != sqlqueue:
        settings.SQLQUEUE = sqlqueue
        get_settings.cache_clear()


def alias_for(conn: Connection) -> str:
    digest = hashlib.sha1(json.dumps(conn.django_database(), sort_keys=True, default=str).encode()).hexdigest()
    return f"sqlqueue_spark_{digest[:12]}"


@contextmanager
def database(options: Mapping[str, str]) -> Iterator[str]:
    """Yield the Django database alias of the options' connection; close it afterwards."""
    conn = Connection.from_options(options)
    with _lock:
        queue = _worker_queue_settings(conn.sqlqueue)
        _ensure_django(queue)
        # A driver that runs the code itself keeps its routes (its other aliases exist).
        _apply_queue_settings(queue if _configured_here else conn.sqlqueue)
        from django.db import connections

        alias = alias_for(conn)
        if alias not in connections.settings:
            entry = connections.configure_settings({"default": conn.django_database()})["default"]
            connections.settings[alias] = entry
    try:
        yield alias
    finally:
        from django.db import connections

        connections[alias].close()


@contextmanager
def driver_database(options: Mapping[str, str]) -> Iterator[str]:
    """Like :func:`database`, but reuse an alias of this process's Django project when one matches.

    For code that runs in the driver (the pipelines): a Django project is set up there,
    and its own alias (with its test-database name, its transactions) is the right one.
    """
    from django.apps import apps

    if apps.ready:
        from django.db import connections

        wanted = Connection.from_options(options)
        for alias in connections:
            db = connections[alias].settings_dict
            if (db.get("ENGINE"), db.get("NAME"), str(db.get("HOST") or ""), str(db.get("PORT") or "")) == (
                wanted.engine,
                wanted.database,
                wanted.host,
                wanted.port,
            ):
                yield alias
                return
    with database(options) as alias:
        yield alias
