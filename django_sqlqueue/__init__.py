"""django-sqlqueue: a partitioned, multi-consumer message queue in your database.

Public API::

    from django_sqlqueue import publish, publish_many, SQLQueueError

Names are imported lazily (PEP 562) so ``import django_sqlqueue`` works before the app
registry is ready (e.g. from a settings module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .consumers import ReceivedMessage, consumer  # noqa: F401
    from .exceptions import (  # noqa: F401
        ConfigurationError,
        InvalidMessage,
        PayloadTooLarge,
        Reject,
        Retry,
        SQLQueueError,
        UnsupportedDatabase,
    )
    from .ops.status import queue_status  # noqa: F401
    from .publisher import publish, publish_many  # noqa: F401

__version__ = "0.1.0.dev0"  # PEP 440; CHANGELOG.md lists what changed since

_EXPORTS = {
    "publish": "publisher",
    "publish_many": "publisher",
    "SQLQueueError": "exceptions",
    "InvalidMessage": "exceptions",
    "PayloadTooLarge": "exceptions",
    "ConfigurationError": "exceptions",
    "UnsupportedDatabase": "exceptions",
    "Retry": "exceptions",
    "Reject": "exceptions",
    "consumer": "consumers",
    "ReceivedMessage": "consumers",
    "queue_status": "ops.status",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
