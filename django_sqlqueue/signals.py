"""Django signals of the queue: react to what is published and what the workers do.

Connect receivers as with any Django signal (in an ``AppConfig.ready()``)::

    from django.dispatch import receiver
    from django_sqlqueue.signals import message_dead_lettered

    @receiver(message_dead_lettered)
    def page_someone(sender, *, group, topic, message_id, error, **kwargs):
        ...

The **sender of the message signals is the topic** (a ``str``), so
``@receiver(message_processed, sender="orders.created")`` listens to one topic; the
sender of the worker signals is the :class:`~django_sqlqueue.worker.Worker` class.
Receivers should accept ``**kwargs``: arguments may be added.

==========================  ==========================================================
signal                      arguments (besides ``sender``)
==========================  ==========================================================
``message_published``       ``message``: the ``PublishedMessage`` (topic, key, partition,
                            id); ``payload``, ``metadata``: as a handler will get them
                            (decoded from the stored JSON). Sent when the publishing
                            transaction **commits** (at
                            once outside a transaction), once per message stored: never
                            for a rolled-back publish, nor for a re-publish of an id
                            that stored nothing. Dead-letter copies are not "published".
``message_processed``       ``message``: the ``ReceivedMessage``; ``duration``: seconds
                            the handler ran. Sent on the worker's handler thread when a
                            handler returned (its ack is written with the batch's).
``message_failed``          ``message``, ``duration``, ``error`` (the exception: a
                            ``Retry``, a ``Reject``, ``HandlerTimeout`` for a timed-out
                            handler, or whatever it raised), ``final``: True when the
                            attempt will not be retried (dead letter follows).
``message_dead_lettered``   ``group``, ``topic``, ``partition``, ``offset``,
                            ``message_id``, ``attempts``, ``error`` (the first line of
                            its ``last_error``), ``dlq_topic``. Sent after the dead
                            letter was written, whatever the cause (last attempt,
                            ``Reject``, expired deliveries, an undecodable row).
``worker_started``          ``worker``: the ``Worker``; ``name``: its subscriber name.
                            Sent once it registered its topics and started its threads.
``worker_stopping``         ``worker``, ``name``. Sent when it begins to shut down
                            (drain, hand-back, lease release follow).
==========================  ==========================================================

**A receiver that raises never breaks delivery or a publish**: signals are sent with
``send_robust`` and a receiver's exception is logged (logger
``django_sqlqueue.signals``, ERROR with its traceback) and otherwise ignored. Receivers
run on the worker's threads, synchronously: keep them short (a slow receiver delays the
next message of its batch), and do not raise to "nack" -- a handler decides outcomes.

This module imports nothing of the package.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

message_published = Signal()
message_processed = Signal()
message_failed = Signal()
message_dead_lettered = Signal()
worker_started = Signal()
worker_stopping = Signal()


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` robustly: a receiver's exception is logged, never raised."""
    if not signal.receivers:  # the common case: nobody listens
        return
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver %s raised %s: %s (ignored)",
                getattr(receiver, "__qualname__", repr(receiver)),
                type(result).__name__,
                result,
                exc_info=(type(result), result, result.__traceback__),
            )
