"""Push wake-ups on PostgreSQL: publishes NOTIFY, workers LISTEN.

Polling finds every message, but a worker that polls every ``POLL_INTERVAL`` makes a new
message wait for its next look. On PostgreSQL a publish also notifies a channel per topic
(``channel_for``), in the INSERT statement itself (``PostgreSQLDialect.execute_insert``);
PostgreSQL queues the notification with the transaction and delivers it only when that
commits, so a rolled-back publish wakes nobody, and a transaction that publishes many
messages sends one notification per topic.

Each worker process keeps **one extra connection** (:class:`Listener`, counted in its
connection budget, ``budget.py``) that LISTENs on the channels of the topics it consumes.
A notification sets the poll loop's wake-up event: the loop polls at once, which
sequences the new message and delivers it (if this worker leases its partition; the
workers that lease the other partitions of the topic poll once for nothing).

**Notifications are hints.** A worker never relies on one: it still polls on its cadence
(``cadence.py``), which finds messages whose notification was lost -- a listener that
was reconnecting, a publish from a process with ``SQLQUEUE["NOTIFY"] = False``, a row
written by other means (the Spark writer does not notify). What the listener changes is
only how soon the first look comes: while it is connected the worker skips the short
looks it otherwise makes after its work ran out. After (re)connecting, the listener wakes
the poll loop once, for what was published while it was not listening.

MySQL, MariaDB and SQLite have no notifications: workers there poll (``cadence.py``).
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from ...db.dialects import get_dialect
from ...rules.notify_channels import channel_for
from ..outage import OutageReporter, is_unreachable
from .service import ServiceThread

logger = logging.getLogger(__name__)

#: Longest wait in one ``select`` before the loop looks at its stop flag again (a stop
#: also wakes it at once through a pipe).
SELECT_TIMEOUT = 5.0


def supported(using: str) -> bool:
    """Whether the database of ``using`` delivers notifications (PostgreSQL with psycopg 3)."""
    connection = connections[using]
    if not get_dialect(connection).supports_notify:
        return False
    try:
        import psycopg  # noqa: F401
    except ImportError:  # psycopg2: no listener (workers poll), see the module docstring
        return False
    return True


class Listener(ServiceThread):
    """A worker's side thread that LISTENs on its topics' channels and wakes its poll loop."""

    thread_name = "sqlqueue-listener"
    title = "listener"

    def __init__(
        self,
        topics: Iterable[str],
        *,
        using: str,
        outage: OutageReporter,
        wake: Callable[[], None],
        on_connected: Callable[[bool], None],
        wanted: Callable[[str, int], bool] | None = None,
        name: str,
        reconnect_interval: float,
    ) -> None:
        """``wake()`` is called for each notification that ``wanted(channel, partition)``
        accepts (default: all; a notification's payload is the message's partition, and a
        worker wants those of the partitions it leases); ``on_connected(True/False)`` when the
        listener starts or stops listening; ``reconnect_interval``: seconds between attempts
        to reconnect a lost connection."""
        super().__init__(using=using, outage=outage, stop_timeout=5.0)
        self.channels = sorted({channel_for(t) for t in topics})
        self.wake = wake
        self.on_connected = on_connected
        self.wanted = wanted
        self.name = name
        self.reconnect_interval = max(1.0, reconnect_interval)
        #: Set while the connection listens (for tests and the status of the worker).
        self.listening = threading.Event()
        #: Notifications received (a counter for tests and logs).
        self.received = 0
        #: Whether the last attempt failed (the next failures are logged at DEBUG).
        self._failing = False
        #: A pipe whose write end :meth:`stop` writes to, ending the listener's ``select``.
        self._pipe: tuple[int, int] | None = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._pipe_lock = threading.Lock()

    def stop(self) -> None:
        with self._pipe_lock:
            if self._pipe is None:  # stopped before: the descriptors may be another file's now
                return
            self.stop_event.set()
            try:
                os.write(self._pipe[1], b"x")  # end the select at once
            except OSError:
                pass
        super().stop()
        with self._pipe_lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            for fd in pipe:
                os.close(fd)

    def body(self) -> None:
        while not self.stop_event.is_set():
            raw = None
            try:
                raw = self._connect()
            except Exception as exc:  # noqa: BLE001 - a missing listener only costs latency
                if self.stop_event.is_set():
                    break
                # An unreachable server (or one refusing more connections) is the worker's
                # outage, reported in a few lines for all its threads; anything else once.
                if is_unreachable(exc):
                    self.outage.unreachable(exc)
                else:
                    self._report(exc, "listener cannot connect")
            else:
                self.outage.reachable()
                self._failing = False
                try:
                    self._listen(raw)
                except Exception as exc:  # noqa: BLE001 - the poll loop finds what it misses
                    if not self.stop_event.is_set():
                        self._report(exc, "listener lost its connection")
                finally:
                    if self.listening.is_set():
                        self.listening.clear()
                        self.on_connected(False)
                    try:
                        raw.close()
                    except Exception:
                        logger.debug("closing the listener's connection failed", exc_info=True)
            self.stop_event.wait(self.reconnect_interval)

    def _wants(self, channel: bytes, payload: bytes) -> bool:
        """Whether a notification concerns this worker: a partition it leases (an empty or
        unreadable payload, from another version's publisher, always does)."""
        if self.wanted is None:
            return True
        try:
            partition = int(payload)
        except ValueError:
            return True
        return self.wanted(channel.decode(errors="replace"), partition)

    def _report(self, exc: BaseException, what: str) -> None:
        """One WARNING per run of failures (the next ones at DEBUG), so that a listener that
        cannot get a connection for an hour does not log one line per attempt."""
        level = logging.DEBUG if self._failing else logging.WARNING
        self._failing = True
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        logger.log(
            level,
            "%s (%s: %s); polling finds new messages meanwhile, retrying every %.0fs subscriber=%s",
            what,
            type(exc).__name__,
            text,
            self.reconnect_interval,
            self.name,
        )

    def _connect(self) -> Any:
        """A psycopg connection of its own, with the alias's connection parameters: not the
        thread's Django connection and never from Django's pool (a pooled connection would
        go back to the pool still listening). Autocommit, named for operators
        (``pg_stat_activity.application_name``) and listening, by the dialect."""
        import psycopg

        django_connection = connections[self.using]
        raw = psycopg.connect(**django_connection.get_connection_params())
        try:
            raw.autocommit = True
            get_dialect(django_connection).start_listening(raw, f"sqlqueue-listener {self.name}", self.channels)
        except BaseException:
            raw.close()
            raise
        return raw

    def _listen(self, raw: Any) -> None:
        """Wait on the socket; hand each notification to ``wake``. Raises when the connection is lost."""
        pgconn = raw.pgconn
        self.listening.set()
        self.on_connected(True)
        logger.info("listening for new messages channels=%s subscriber=%s", ",".join(self.channels), self.name)
        # Whatever was published while nobody listened: one poll finds it.
        self.wake()
        pipe = self._pipe
        if pipe is None:
            return
        while not self.stop_event.is_set():
            ready, _, _ = select.select([pgconn.socket, pipe[0]], [], [], SELECT_TIMEOUT)
            if self.stop_event.is_set():
                return
            if not ready:
                continue
            if pgconn.socket in ready:
                pgconn.consume_input()  # raises psycopg.OperationalError on a lost connection
                woke = False
                while (notice := pgconn.notifies()) is not None:
                    self.received += 1
                    woke = woke or self._wants(notice.relname, notice.extra)
                if woke:
                    self.wake()
                if pgconn.status != 0:  # CONNECTION_OK
                    raise ConnectionError("the listener's connection is no longer usable")
