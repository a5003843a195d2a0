"""testing/mixins.py: ``SQLQueueTestMixin`` gives each test of a ``TestCase`` its own capture,
closed by the test's cleanup, and the assertions on it."""

from __future__ import annotations

from django.test import TestCase

from django_sqlqueue import publish
from django_sqlqueue.testing.mixins import SQLQueueTestMixin

TOPIC = "testing.mixins"


class CaptureTests(SQLQueueTestMixin, TestCase):
    def test_each_test_has_a_capture_that_its_cleanup_closes(self) -> None:
        publish(TOPIC, {"order": 1}, key="alice")
        [message] = self.assertPublished(TOPIC, key="alice", payload={"order": 1}, count=1)
        self.assertEqual(message.payload, {"order": 1})
        self.assertNotPublished(TOPIC, key="bob")
        with self.assertRaisesMessage(AssertionError, f"Published (1):\n  {TOPIC} key='alice'"):
            self.assertPublished(TOPIC, key="bob")
        self.doCleanups()  # what unittest runs after the test: the capture closes
        publish(TOPIC, {"order": 2}, key="bob")
        self.assertNotPublished(TOPIC, key="bob")
        self.assertEqual(len(self.published), 1)

    def test_a_test_starts_with_an_empty_capture(self) -> None:
        self.assertEqual(len(self.published), 0)
        self.assertNotPublished()
