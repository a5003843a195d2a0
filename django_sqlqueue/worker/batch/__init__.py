"""Running one fetched batch of a consumer: handler calls, what their outcomes mean, atomic consumers.

What lives here:

- ``runner`` -- :class:`~.runner.BatchRunner`: the handlers over a batch's messages, one
  after the other (and the seam its owner uses: ``hooks``);
- ``outcomes`` -- what a handler's return or exception means (ack, nack with backoff,
  dead letter) and the writes it leads to, the worker's counters, :class:`~.outcomes.BatchHooks`;
- ``atomic`` and ``atomic_batches`` -- atomic consumers: the handler's writes and its ack
  in one transaction, per message or per partition batch;
- ``handlers`` -- calling a sync or ``async def`` handler;
- ``progress`` -- the state a batch on a handler thread shares with the watchdog.

It may import the data layer (``db/``), the consumer specs, the write path and the rules
below the worker, and ``worker/subscription``; never ``worker/threads/`` (which imports
it), the poller or the worker loop.
"""
