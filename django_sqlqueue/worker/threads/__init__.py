"""The worker's side threads, each a :class:`~.service.ServiceThread` the worker supervises.

``leasing`` (the lease keeper: fair share, renewals, hand-over), ``listener`` (PostgreSQL
LISTEN: wakes the poll loop), ``scheduler`` (recurring tasks and messages), ``collector``
(garbage collection between polls), ``executor`` (handler threads) and ``watchdog``
(handler timeouts: gives a stuck batch up).

They may import ``worker/batch/`` and the worker-level modules (``subscription``,
``outage``), never ``loop`` or ``poller``, which assemble them.
"""
