"""A ``TestCase`` mixin: the published messages of each test, and its assertions."""

from __future__ import annotations

from typing import Any

from .capture import ANY, CapturedMessage, PayloadMatcher, PublishedMessages, capture_published
from .draining import DrainSummary, drain


class SQLQueueTestMixin:
    """Mix into a Django ``TestCase`` (or ``TransactionTestCase``)::

        class CheckoutTests(SQLQueueTestMixin, TestCase):
            def test_publishes(self):
                self.client.post("/orders/", {"customer": "alice", "total": "12.50"})
                self.assertPublished("orders.created", key="alice")
                self.assertEqual(self.drain().dead_lettered, 0)

    ``self.published`` records what each test publishes (a :func:`capture_published`
    opened in ``setUp`` and closed by a cleanup). While the test runs it is the open
    capture the module-level ``assert_published()`` / ``assert_enqueued()`` look at; once
    closed no later test sees it.
    """

    published: PublishedMessages

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        capture = capture_published()
        self.published = capture.__enter__()
        self.addCleanup(capture.__exit__, None, None, None)  # type: ignore[attr-defined]

    def assertPublished(
        self, topic: str, *, key: Any = ANY, payload: PayloadMatcher = ANY, count: int | None = None
    ) -> list[CapturedMessage]:
        """Assert that ``topic`` got a matching message (see ``PublishedMessages.assert_published``)."""
        return self.published.assert_published(topic, key=key, payload=payload, count=count)

    def assertNotPublished(self, topic: str | None = None, *, key: Any = ANY, payload: PayloadMatcher = ANY) -> None:
        """Assert that no matching message was published."""
        self.published.assert_not_published(topic, key=key, payload=payload)

    def assertEnqueued(
        self, task: Any, *, args: Any = ANY, kwargs: Any = ANY, count: int | None = None
    ) -> list[CapturedMessage]:
        """Assert that ``task`` was enqueued (the ``django.tasks`` backend; see ``testing.tasks``)."""
        from .tasks import assert_enqueued

        return assert_enqueued(task, args=args, kwargs=kwargs, count=count, published=self.published)

    def drain(
        self, topic: str | None = None, *, group: str | None = None, max_messages: int | None = None
    ) -> DrainSummary:
        """Run the registered consumers until the queue is empty (see :func:`drain`)."""
        return drain(topic, group=group, max_messages=max_messages)
