"""Retrying database operations that failed for transient reasons.

A deadlock (MySQL 1213) or lock-wait timeout (1205) rolls the transaction back; every
store operation is idempotent, so it is run again. A lost connection (2006 "server has
gone away", 2013 "lost connection during query") closes Django's connection so the
next attempt reconnects. A connection the server refuses because it has too many
(MySQL 1040, a per-account limit 1203/1226, PostgreSQL 53300 -- also a role's or
database's ``CONNECTION LIMIT``) is treated the same way: the server is there but will
not take us yet, which for a worker is an outage like any other. Anything else
propagates.

Pauses after a lost connection wait on ``stop_event`` when one is given, so a worker
asked to stop during a database outage does not sit out a retry sleep: once it is set,
the remaining attempts run without pausing. Lost connections are retried
quietly (DEBUG): an outage is reported by :mod:`django_sqlqueue.worker.outage`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connections
from django.db.utils import InterfaceError

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: MySQL: deadlock, lock-wait timeout.
DEADLOCK_CODES = frozenset({1213, 1205})
#: MySQL: too many connections (server-wide ``max_connections``), too many for this
#: account (``max_user_connections``), an account resource limit reached.
TOO_MANY_CONNECTIONS_CODES = frozenset({1040, 1203, 1226})
#: MySQL: server gone away, lost connection, cannot connect, and the server refusing
#: another connection.
CONNECTION_CODES = frozenset({2006, 2013, 2002, 2003}) | TOO_MANY_CONNECTIONS_CODES
#: PostgreSQL SQLSTATEs: serialization failure, deadlock, lock timeout (not "57014"
#: statement timeout, which is deliberate and must not be retried).
PG_RETRY_STATES = frozenset({"40001", "40P01", "55P03"})
#: PostgreSQL SQLSTATEs of a dead session: admin/crash/cannot-connect shutdown, and
#: 53300 too_many_connections (``max_connections``, or a role's or database's
#: ``CONNECTION LIMIT``).
PG_LOST_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
#: SQLite has no codes worth reading: a busy database is worth another try.
TRANSIENT_TEXT = ("database is locked",)
#: psycopg raises a refused connection attempt without a SQLSTATE (there is no result to
#: read it from): the server's messages for 53300 are matched instead.
LOST_TEXT = (
    "server closed the connection",
    "the connection is closed",
    "too many clients already",
    "too many connections for",
    "remaining connection slots are reserved",
)


def is_transient(exc: BaseException) -> tuple[bool, bool]:
    """Return (transient, connection_lost) for a database error."""
    if isinstance(exc, InterfaceError):
        return True, True
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code in DEADLOCK_CODES:
        return True, False
    if code in CONNECTION_CODES:
        return True, True
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    if state in PG_RETRY_STATES:
        return True, False
    if state in PG_LOST_STATES or state.startswith("08"):
        return True, True
    text = str(exc).lower()
    lost = any(marker in text for marker in LOST_TEXT)
    return lost or any(marker in text for marker in TRANSIENT_TEXT), lost


def with_retries(
    fn: Callable[[], T],
    *,
    using: str,
    what: str,
    attempts: int = 5,
    stop_event: threading.Event | None = None,
) -> T:
    """Run ``fn``, retrying transient database errors with a short growing pause."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (OperationalError, InterfaceError) as exc:
            transient, lost = is_transient(exc)
            if not transient or attempt == attempts:
                raise
            pause = min(0.05 * 2**attempt, 1.0)
            if lost:
                connections[using].close()
                logger.debug("retrying %s after %s (attempt %d/%d)", what, exc, attempt, attempts)
                if stop_event is not None:
                    # A stop cuts the pause short; the remaining attempts then run at once,
                    # so a drain still reconnects after an idle drop but never waits out an outage.
                    stop_event.wait(pause)
                    continue
            else:
                logger.warning("retrying %s after %s (attempt %d/%d)", what, exc, attempt, attempts)
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


class Retrying:
    """``with_retries`` bound to one alias and stop event: ``db("what", fn)`` returns ``fn()``.

    Each of a worker's threads (poll loop, handler threads, lease keeper) builds one for
    the queue alias and the worker's stop event, so a stop cuts a retry pause short.
    """

    def __init__(self, using: str, stop_event: threading.Event | None = None) -> None:
        self.using = using
        self.stop_event = stop_event

    def __call__(self, what: str, fn: Callable[[], T]) -> T:
        return with_retries(fn, using=self.using, what=what, stop_event=self.stop_event)
