"""The connection budget: how many database connections one worker process holds.

Django opens one connection per thread and database alias, and a worker's threads keep
theirs for the life of the process (``db/conn.py``). On the queue's alias a
``runconsumer`` process holds:

- **1 for the poll loop** (the main thread): polls, sequencing, deliveries, garbage
  collection between polls, giving up timed-out batches, and -- with ``--concurrency 1``
  and no handler timeout -- the handlers and their acks;
- **1 for the lease keeper** thread (heartbeats, renewals), its own so that a slow
  handler never delays a renewal;
- **N for the handler threads** with ``--concurrency N``: each writes its batches'
  outcomes on its own connection (the poll loop keeps its own as well). With N = 1 only
  when a handler has a timeout (the default), so that the poll loop is free to watch it
  (``watchdog.py``). A thread abandoned in a timed-out handler keeps its connection until
  the handler returns: up to N more, after which the worker exits;
- **1 for the scheduler** thread, when the worker fires schedules (``SQLQUEUE["SCHEDULES"]``
  is not empty and ``--no-schedules`` is not given);
- **1 for the notification listener** on PostgreSQL (``SQLQUEUE["NOTIFY"]``, the default):
  a connection that LISTENs for new messages of the worker's topics (``worker/threads/listener.py``);
- **1 for the tasks backend's running marks** (``tasks/marks.py``), only in a process that
  runs a ``django.tasks`` task longer than ``OPTIONS["MARK_RUNNING_AFTER"]``: it writes such
  tasks' result rows RUNNING while they run, and closes its connection when idle;
- **1 for asgiref's thread-sensitive thread**, when a handler is ``async def``: the async
  ORM and ``aextend_visibility`` run there, one thread per process shared by every
  handler thread.

Handlers that use other database aliases open one connection per alias on each thread
that runs handlers (the poll loop, or each handler thread, and the async thread): they
are the application's, not counted here. So are connections opened on the event
loop's thread pool by ``sync_to_async(..., thread_sensitive=False)``.

**Why the scheduler keeps a connection of its own.** Sharing the lease keeper's thread
would save one connection per worker, but a scheduler pass waits on a schedule's row
lock while another worker fires the same tick, and a catch-up publishes many ticks in
one transaction: renewals would wait behind both, and a late renewal loses leases. On the
poll loop, a long batch would hold ticks back. The cheap cut is operational instead:
``--no-schedules`` on all but a few workers (every tick fires once, whoever fires it).

The same numbers are in README.md ("Running in production", "Connections"); the worker
warns at start when the server has less room left than its budget (``room_warning``).
This module imports nothing of the package: the worker computes its budget, the data
layer reads the server's limit, and both meet here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectionBudget:
    """The connections one worker process holds on the queue's database alias."""

    poll_loop: int = 1
    lease_keeper: int = 1
    handler_threads: int = 0
    scheduler: int = 0
    async_thread: int = 0
    listener: int = 0

    @property
    def total(self) -> int:
        threads = self.handler_threads + self.scheduler + self.async_thread + self.listener
        return self.poll_loop + self.lease_keeper + threads

    def describe(self) -> str:
        """``poll loop 1 + lease keeper 1 + handler threads 4 = 6``: the parts that are not 0."""
        parts = [
            ("poll loop", self.poll_loop),
            ("lease keeper", self.lease_keeper),
            ("handler threads", self.handler_threads),
            ("scheduler", self.scheduler),
            ("async handlers' thread", self.async_thread),
            ("notification listener", self.listener),
        ]
        return " + ".join(f"{what} {n}" for what, n in parts if n) + f" = {self.total}"


def connection_budget(
    *,
    concurrency: int,
    scheduler: bool,
    async_handlers: bool,
    handler_threads: bool | None = None,
    listener: bool = False,
) -> ConnectionBudget:
    """Return the budget of a worker run with ``--concurrency concurrency``.

    ``scheduler``: the worker fires schedules; ``async_handlers``: one of its handlers is
    ``async def``; ``handler_threads``: batches run on handler threads (the default:
    ``concurrency`` > 1; a worker whose handlers have a timeout uses one even with 1);
    ``listener``: it listens for notifications (PostgreSQL).
    """
    threaded = concurrency > 1 if handler_threads is None else handler_threads or concurrency > 1
    return ConnectionBudget(
        handler_threads=concurrency if threaded else 0,
        scheduler=1 if scheduler else 0,
        async_thread=1 if async_handlers else 0,
        listener=1 if listener else 0,
    )


def room_warning(limits: Sequence[tuple[str, int, int]], *, needed: int, open_now: int = 1) -> str | None:
    """Say what is missing if the server cannot take this worker's connections, else None.

    ``limits``: the server's limits on this account's connections, ``(what, limit,
    in_use)`` each (``max_connections``, a role's ``CONNECTION LIMIT`` ...), where
    ``in_use`` counts ``open_now`` connections of this worker (the poll loop's, which
    read the numbers); ``needed``: the worker's budget. The tightest limit is reported.
    """
    more = needed - open_now
    short = [(limit - in_use, what, limit, in_use) for what, limit, in_use in limits if limit - in_use < more]
    if not short:
        return None
    room, what, limit, in_use = min(short)
    return (
        f"the database server has room for {max(room, 0)} more connection(s) under {what} ({limit}, {in_use} in "
        f"use) but this worker needs {more} more; it will retry until some are freed. Set {what} to at least "
        f"{in_use - open_now + needed} for this worker alone, and to the budget of every worker and web process "
        "you run plus headroom (README.md: Running in production, Connections)"
    )
