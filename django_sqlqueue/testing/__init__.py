"""Testing helpers for projects that use django-sqlqueue (see docs/testing.md).

- :func:`capture_published` records the messages a block publishes, commit-aware;
  :func:`assert_published` / :func:`assert_not_published` check them, with failure
  messages that list what was published;
- :func:`drain` runs the registered consumers in-process through the real delivery path
  until the queue is empty, retry delays collapsed; :func:`process` calls one handler on
  one message;
- :class:`SQLQueueTestMixin` for ``TestCase`` classes; pytest fixtures
  ``sqlqueue_published`` and ``sqlqueue_drain`` (``pytest_plugin.py``);
- for the ``django.tasks`` backend, :mod:`django_sqlqueue.testing.tasks`:
  ``assert_enqueued``, ``assert_not_enqueued``, ``drain_tasks``.

Explicit, never implicit: importing this package changes nothing -- no signal is
connected, nothing is patched, no setting is switched -- until a helper is called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .capture import (  # noqa: F401
        ANY,
        CapturedMessage,
        PublishedMessages,
        assert_not_published,
        assert_published,
        capture_published,
    )
    from .draining import ConsumerSummary, DrainSummary, drain, process  # noqa: F401
    from .mixins import SQLQueueTestMixin  # noqa: F401

# Imported on first use: the pytest plugin (a submodule) loads before Django is set up.
_EXPORTS = {
    "ANY": "capture",
    "CapturedMessage": "capture",
    "PublishedMessages": "capture",
    "assert_not_published": "capture",
    "assert_published": "capture",
    "capture_published": "capture",
    "ConsumerSummary": "draining",
    "DrainSummary": "draining",
    "drain": "draining",
    "process": "draining",
    "SQLQueueTestMixin": "mixins",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_sqlqueue.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
