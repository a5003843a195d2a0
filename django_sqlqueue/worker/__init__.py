"""The ``runconsumer`` process: a :class:`Worker` per database and the parts it is built from.

What lives here, and what it may import:

- ``loop`` -- :class:`Worker`: lifecycle, the poll loop's rounds, supervision of its threads;
  ``startup`` -- what a worker checks and registers before its first poll; ``fleet`` --
  several workers in one process, one per database (``SQLQUEUE["TOPIC_DATABASES"]``);
- ``poller`` (one poll's plan), ``dispatch`` (where its batches run: inline or on handler
  threads, chosen once), ``cadence`` (when to look next), ``probe`` (the cheap look),
  ``subscription`` (one consumer's state in this process), ``budget`` (connections),
  ``healthfile``, ``outage``, ``shutdown``, ``logsetup`` (the process's edges);
- ``batch/`` -- running one fetched batch: handler calls, outcomes, atomic consumers;
- ``threads/`` -- the side threads: lease keeper, listener, scheduler, collector,
  handler executor and watchdog, all on :class:`~.threads.service.ServiceThread`.

The worker imports the data layer (``db/``), the write path (``publisher``), the consumer
specs and the rules below it; nothing below imports the worker, and the worker never
imports the operator layer (``ops/``, ``console/``, ``management/``) or the optional
integrations (the ``layers`` contract in ``pyproject.toml``). Within it, ``threads/``
may import ``batch/``, never the other way round.
"""

from .loop import Worker

__all__ = ["Worker"]
