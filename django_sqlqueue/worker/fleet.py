"""Several workers in one process: one :class:`~.loop.Worker` per database alias.

``SQLQUEUE["TOPIC_DATABASES"]`` routes topics to database aliases (``rules/routes.py``); a
topic's messages, its dead letters, its leases, its groups' watermarks and heartbeats all
live in the database it is routed to. ``runconsumer`` serves every database its consumers'
topics live in with one worker each (:func:`plan`), each with its own lease keeper,
heartbeats, sequencer, listener, garbage collector and connections -- nothing is shared
across databases but the process, its signal handlers and its metrics.

:class:`Fleet` runs them on threads of this process (a single worker runs on the calling
thread, as it always did):

- a stop (the first SIGTERM/SIGINT: ``shutdown.py``) stops every worker; each drains as it
  would alone (finishes the message in hand, hands back its leases);
- a worker that ends -- a side thread or handler thread died (``WorkerCrashed``), a handler
  raised ``SystemExit`` -- stops the others, and :meth:`Fleet.run` raises its error once
  all have handed back their leases: the process exits non-zero and its manager restarts it
  whole, so no database is left served by a half-dead process;
- ``--health-file`` is touched only while *every* worker's rounds are healthy
  (:class:`SharedHealth`).

Recurring schedules fire from the worker of ``SQLQUEUE["DATABASE"]`` only: their state rows
(``queue_schedules``) live there, and the row lock that fires each tick once must be taken
in one database by every process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from django.db import DatabaseError, connections

from ..conf import QueueSettings
from ..consumers import ConsumerSpec
from ..exceptions import QueueTablesMissing
from ..instruments import Instruments
from ..models import Message
from ..schedules import Schedule
from .healthfile import HealthFile
from .loop import Worker

logger = logging.getLogger(__name__)

#: Seconds between two looks of the calling thread at the workers' threads (a join that
#: wakes up lets the main thread run the signal handlers promptly).
JOIN_INTERVAL = 0.5
#: Seconds a worker's last healthy round counts for the shared health file: a worker
#: whose poll loop is unhealthy, or has not finished a round for this long, holds it back.
HEALTH_WINDOW = 10.0


def plan(
    specs: Iterable[ConsumerSpec], conf: QueueSettings, only: Iterable[str] | None = None
) -> dict[str, list[ConsumerSpec]]:
    """Group ``specs`` by the alias of the database that holds their topic, in the order of
    ``conf.databases``; keep the aliases of ``only`` if given (None: every alias)."""
    wanted = None if only is None else set(only)
    grouped: dict[str, list[ConsumerSpec]] = {alias: [] for alias in conf.databases}
    for spec in specs:
        grouped.setdefault(conf.database_for(spec.topic), []).append(spec)
    return {alias: found for alias, found in grouped.items() if found and (wanted is None or alias in wanted)}


def require_tables(aliases: Iterable[str]) -> None:
    """Raise :class:`QueueTablesMissing` naming the ``migrate`` command for an alias whose
    database is reachable but lacks the queue's tables. An alias that cannot be reached
    now passes: its worker waits out the outage (``startup.py``)."""
    table = Message._meta.db_table
    for alias in aliases:
        try:
            with connections[alias].cursor() as cursor:
                present = table in connections[alias].introspection.table_names(cursor)
        except DatabaseError:
            continue
        finally:
            if not connections[alias].in_atomic_block:  # (a test's transaction stays open)
                connections[alias].close()  # the workers open their own, on their threads
        if not present:
            raise QueueTablesMissing(
                f"database {alias!r} holds topics (SQLQUEUE['TOPIC_DATABASES']) but not the queue's tables: "
                f"run `manage.py migrate django_sqlqueue --database {alias}`."
            )


class SharedHealth:
    """One health file for several workers: touched only while every one of them is healthy."""

    def __init__(self, path: str, workers: int, *, window: float = HEALTH_WINDOW) -> None:
        self.file = HealthFile(path)
        self.window = window
        #: Per worker: when its last healthy round ended (None: never, or its last was unhealthy).
        self._healthy_at: list[float | None] = [None] * workers
        self._lock = threading.Lock()

    def member(self, index: int) -> HealthFile:
        """The health file worker ``index`` beats (``Worker.health_file``)."""
        return _Member(self, index)

    def beat(self, index: int, healthy: bool) -> None:
        """Record worker ``index``'s round; touch the file when every worker is healthy."""
        now = time.monotonic()
        with self._lock:  # workers beat from their own poll-loop threads
            self._healthy_at[index] = now if healthy else None
            everyone = all(t is not None and now - t < self.window for t in self._healthy_at)
            if everyone:
                self.file.beat(True)


class _Member(HealthFile):
    """What one worker of a :class:`SharedHealth` beats."""

    def __init__(self, shared: SharedHealth, index: int) -> None:
        super().__init__(None)
        self.shared, self.index = shared, index

    def beat(self, healthy: bool) -> None:
        self.shared.beat(self.index, healthy)


class Fleet:
    """Runs ``workers`` (one per database) until :meth:`stop`; see the module docstring."""

    def __init__(self, workers: list[Worker], *, health_file: str | None = None) -> None:
        if not workers:
            raise ValueError("a fleet needs at least one worker")
        self.workers = workers
        #: The error of the first worker that ended by one (raised by :meth:`run`).
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        if health_file is not None:
            shared = SharedHealth(health_file, len(workers))
            for index, worker in enumerate(workers):
                worker.health_file = shared.member(index)

    @classmethod
    def build(
        cls,
        planned: dict[str, list[ConsumerSpec]],
        *,
        name: str,
        conf: QueueSettings,
        concurrency: int = 1,
        schedules: list[Schedule] | None = None,
        health_file: str | None = None,
        instruments: Instruments | None = None,
    ) -> Fleet:
        """One worker per alias of ``planned`` (:func:`plan`), all named ``name`` (a subscriber's
        name is per database); only the worker of ``SQLQUEUE["DATABASE"]`` fires ``schedules``."""
        single = len(planned) == 1
        if schedules and conf.DATABASE not in planned:
            logger.info(
                "no schedule fires from this process: schedules fire from the workers of database %s "
                "(SQLQUEUE['DATABASE']), which it does not serve",
                conf.DATABASE,
            )
        workers = [
            Worker(
                specs,
                name=name,
                conf=conf,
                using=alias,
                concurrency=concurrency,
                schedules=schedules if alias == conf.DATABASE else None,
                health_file=health_file if single else None,
                instruments=instruments,
            )
            for alias, specs in planned.items()
        ]
        return cls(workers, health_file=None if single else health_file)

    @property
    def aliases(self) -> list[str]:
        """The databases served, in order."""
        return [worker.store.using for worker in self.workers]

    def stop(self) -> None:
        """Ask every worker to drain and stop (safe to call from any thread, more than once)."""
        for worker in self.workers:
            worker.stop()

    def run(self) -> None:
        """Run every worker until all have stopped; raise the first worker's error, if any."""
        if len(self.workers) == 1:
            self.workers[0].run()  # on this thread, exactly as a single worker always ran
            return
        logger.info("serving databases=%s", ",".join(self.aliases))
        threads = [
            threading.Thread(target=self._run_one, args=(worker,), name=f"sqlqueue-worker-{worker.store.using}")
            for worker in self.workers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_INTERVAL)
        if self.error is not None:
            raise self.error

    def _run_one(self, worker: Worker) -> None:
        """A worker's thread: run it; when it ends, for whatever reason, stop the others."""
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread by run()
            with self._lock:
                if self.error is None:
                    self.error = exc
            logger.error(
                "worker of database %s ended (%s); stopping the workers of the other databases",
                worker.store.using,
                type(exc).__name__,
            )
        finally:
            self.stop()
