"""Reporting a database outage in a few lines instead of a traceback per retry.

While the database is unreachable every poll and every lease round fails. One
:class:`OutageReporter`, shared by a worker's poll loop and its lease-keeper thread,
turns that into:

- one WARNING when the first operation fails (``database unreachable ...``), with the
  error's first line and no traceback;
- one WARNING every ``OUTAGE_REPORT_INTERVAL`` seconds while it lasts, with the number
  of failed operations and the duration so far;
- one WARNING when an operation succeeds again (``database reachable again after N s``).

The outage is tracked per thread: it starts when the first thread fails and ends when
every thread that failed has succeeded again. When the server refuses connections
because it has too many (MySQL 1040, PostgreSQL 53300), a worker's poll loop may keep
its connection while its lease keeper cannot open one; the poll loop's successes must
not end (and the keeper's next failure restart) the outage every second.

Errors that are not connection failures (a bug, a constraint violation) are still logged
with their traceback by the caller, through :meth:`OutageReporter.failure`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import InterfaceError, OperationalError

from ..db.retry import is_transient

logger = logging.getLogger(__name__)

#: Lower-cased fragments of driver messages that mean "cannot reach the server", for
#: drivers whose connect errors carry no code (psycopg) or an unusual one.
UNREACHABLE_TEXT = (
    "connection refused",
    "could not connect",
    "can't connect",
    "server closed the connection",
    "connection is closed",
    "connection already closed",
    "lost connection",
    "gone away",
    "terminating connection",
    "consuming input failed",
    "connection timed out",
    "no route to host",
)


def is_unreachable(exc: BaseException) -> bool:
    """Return True if ``exc`` means the database server cannot be reached (connect or lost)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (OperationalError, InterfaceError)):
            if is_transient(current)[1]:
                return True
            text = str(current).lower()
            if any(marker in text for marker in UNREACHABLE_TEXT):
                return True
        current = current.__cause__ or current.__context__
    return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class OutageReporter:
    """Thread-safe outage state of one worker (its poll loop and lease keeper)."""

    def __init__(self, *, alias: str, report_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.alias = alias
        self.report_interval = report_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0
        self._last_report = 0.0
        #: Threads (idents) whose last operation failed because the database was unreachable.
        self._failing: set[int] = set()
        #: Outages so far: a thread whose connection sat idle through one closes it before
        #: using it again (its server side is likely gone).
        self.outages = 0

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failure(self, log: logging.Logger, exc: BaseException, msg: str, *args: object) -> None:
        """Report a failed operation: an outage line if the database is unreachable, else ``msg`` with traceback."""
        if is_unreachable(exc):
            self.unreachable(exc)
        else:
            log.error(msg, *args, exc_info=exc)

    def unreachable(self, exc: BaseException) -> None:
        """Count one operation that failed because the database cannot be reached."""
        now = self._clock()
        with self._lock:
            self._failures += 1
            self._failing.add(threading.get_ident())
            if self._since is None:
                self._since = self._last_report = now
                self.outages += 1
                logger.warning(
                    "database unreachable, retrying until it is back alias=%s error=%s", self.alias, first_line(exc)
                )
            elif now - self._last_report >= self.report_interval:
                self._last_report = now
                logger.warning(
                    "database still unreachable after %.0fs failed_attempts=%d alias=%s error=%s",
                    now - self._since,
                    self._failures,
                    self.alias,
                    first_line(exc),
                )

    def reachable(self) -> None:
        """Record a successful operation of this thread; the outage, if any, ends with one
        line once every thread that failed has succeeded again."""
        if self._since is None:  # the common case: no lock
            return
        now = self._clock()
        with self._lock:
            self._failing.discard(threading.get_ident())
            if self._since is None or self._failing:  # ended meanwhile, or other threads still fail
                return
            logger.warning(
                "database reachable again after %.1fs failed_attempts=%d alias=%s",
                now - self._since,
                self._failures,
                self.alias,
            )
            self._since = None
            self._failures = 0
