"""Hooks the worker calls where a metrics layer counts what the signals do not cover.

Per-message events are Django signals (:mod:`django_sqlqueue.signals`), a public API.
Polls, batches, sequencer runs and lease changes happen many times a second and matter
only to monitoring, so they go to an :class:`Instruments` object the worker is given
instead (``Worker(instruments=...)``); the base class does nothing, so a worker without
metrics pays one method call per event. :class:`django_sqlqueue.metrics.worker.WorkerMetrics`
implements them for ``runconsumer --metrics-port``.

The hooks are called on the poll loop's thread (polls, batches, sequencer runs) and the
lease keeper's (lease changes): an implementation must be thread-safe and must not raise
or block (``prometheus_client`` metrics are both).
"""

from __future__ import annotations


class Instruments:
    """The worker's monitoring hooks; every method is a no-op here."""

    def polled(self, group: str, topic: str, seconds: float, batches: int) -> None:
        """A poll of one subscription planned and recorded its deliveries (the handlers not
        included) in ``seconds``, handing out ``batches`` batches (0: nothing to do)."""

    def batch(self, group: str, topic: str, size: int) -> None:
        """A batch of ``size`` messages of one partition was handed to the handlers."""

    def sequenced(self, topic: str, seconds: float, numbered: int) -> None:
        """A sequencer run of ``topic`` numbered ``numbered`` messages in ``seconds``."""

    def leases(self, group: str, topic: str, *, acquired: int = 0, released: int = 0, lost: int = 0) -> None:
        """Partition leases changed hands: ``acquired`` taken, ``released`` given back (fair
        share, a pause, a handler timeout, shutdown), ``lost`` found taken by another subscriber."""


#: The hooks of a worker without metrics.
NO_INSTRUMENTS = Instruments()
