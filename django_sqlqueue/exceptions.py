"""Exceptions raised by django-sqlqueue.

Every error the library raises on purpose derives from :class:`SQLQueueError`, so
callers can catch the whole family with one ``except`` clause.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class SQLQueueError(Exception):
    """Base class of every django-sqlqueue error."""


class InvalidMessage(SQLQueueError, ValueError):
    """A message given to ``publish()``/``publish_many()`` is malformed.

    Raised before anything is written: no row of the batch is stored.
    """


class PayloadTooLarge(InvalidMessage):
    """The serialized payload exceeds ``SQLQUEUE["MAX_PAYLOAD_BYTES"]``."""


class ConfigurationError(SQLQueueError, ImproperlyConfigured):
    """The ``SQLQUEUE`` setting is invalid."""


class UnsupportedDatabase(SQLQueueError):
    """The database vendor of the queue connection is not supported."""
