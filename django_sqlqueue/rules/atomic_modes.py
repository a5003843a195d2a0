"""The ``atomic`` option of ``@consumer``: which values it takes and how operators read it.

A leaf: the consumer specs, the tasks backend and the operator pages check and show the
option without importing the worker that implements it (``worker/batch/atomic.py``).
"""

from __future__ import annotations

from typing import Any

from ..exceptions import ConfigurationError

#: ``atomic="batch"``.
BATCH = "batch"


def validate_atomic(value: Any, consumer: str) -> bool | str:
    """Return ``value`` if it is an ``atomic`` option (True, False or "batch"), else raise
    :class:`~django_sqlqueue.exceptions.ConfigurationError` naming ``consumer``."""
    if value is True or value is False or value == BATCH:
        return value
    raise ConfigurationError(f"consumer {consumer}: atomic must be True, False or {BATCH!r}, got {value!r}.")


def describe(value: bool | str) -> str:
    """The ``atomic`` option as operators see it: "no", "per message" or "per batch"."""
    if value == BATCH:
        return "per batch"
    return "per message" if value else "no"
