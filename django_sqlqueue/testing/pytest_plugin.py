"""The pytest fixtures of django-sqlqueue: ``sqlqueue_published`` and ``sqlqueue_drain``.

Installed with the package as a ``pytest11`` entry point (named after this module, so
``-p django_sqlqueue.testing.pytest_plugin`` in a project that vendors the package does
the same). It only *defines* fixtures: nothing is autouse, no hook changes collection or
a test's run, and nothing is imported from Django until a test asks for a fixture. A
test opts in by naming one; ``-p no:django_sqlqueue.testing.pytest_plugin`` removes
them::

    @pytest.mark.django_db
    def test_checkout_publishes(client, sqlqueue_published):
        client.post("/orders/", {"customer": "alice", "total": "12.50"})
        sqlqueue_published.assert_published("orders.created", key="alice")

    @pytest.mark.django_db
    def test_billing(sqlqueue_drain):
        publish("orders.created", {...})
        summary = sqlqueue_drain("orders.created")
        assert summary["billing:orders.created"].handled == 1

``sqlqueue_published`` is open for the whole test, so the module-level
``assert_published()`` / ``assert_enqueued()`` of the test look at it; it closes at the
test's teardown and no later test sees it.

``sqlqueue_drain`` needs database access: mark the test ``django_db`` (the test's
transaction is enough) or use ``transactional_db`` (see ``django_sqlqueue.testing.draining``).
Without it, a drain raises one ``TestingError`` that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .capture import PublishedMessages
    from .draining import DrainSummary


#: How pytest-django's database blocker starts its refusal (``_blocking_wrapper``).
_BLOCKED = "Database access not allowed"


@pytest.fixture
def sqlqueue_published() -> Iterator[PublishedMessages]:
    """The messages published during the test (``capture_published()`` around it, closed at teardown)."""
    from .capture import capture_published

    with capture_published() as published:
        yield published


@pytest.fixture
def sqlqueue_drain() -> Callable[..., DrainSummary]:
    """``django_sqlqueue.testing.draining``: run the registered consumers until the queue is empty."""
    from ..exceptions import TestingError
    from .draining import drain

    def run(*args: Any, **kwargs: Any) -> DrainSummary:
        __tracebackhide__ = True  # a failure points at the test's line, not at this wrapper
        try:
            return drain(*args, **kwargs)
        except RuntimeError as exc:
            if not str(exc).startswith(_BLOCKED):
                raise
            # pytest-django's refusal, raised before the drain did anything: nothing to chain.
            raise TestingError(
                "sqlqueue_drain needs the database: mark the test @pytest.mark.django_db (the test's "
                "transaction is enough) or use the transactional_db fixture."
            ) from None

    return run
