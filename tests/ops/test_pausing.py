"""ops/pausing.py: pausing and resuming a group on a topic.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.models import PartitionLease, PausedTopic
from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.pausing import REASON_LENGTH, pause, paused_topics, resume

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_pause_and_resume():
    build()
    assert pause("billing", "orders", by="alice", reason="bad deploy") is True
    assert pause("billing", "orders") is False
    row = PausedTopic.objects.get()
    assert (row.paused_by, row.reason) == ("alice", "bad deploy")
    assert not PartitionLease.objects.filter(consumer_group="billing").exists()
    assert [p.group for p in paused_topics()] == ["billing"]
    assert resume("billing", "orders") is True and resume("billing", "orders") is False


def test_a_reason_longer_than_the_limit_is_refused_and_nothing_is_paused():
    """Issue 28 (F11): a reason of 100,000 characters was stored whole."""
    build()
    leases = PartitionLease.objects.count()
    for reason in ("x" * (REASON_LENGTH + 1), "x" * 100_000):
        with pytest.raises(OperationError, match=rf"reason is {len(reason)} characters long; at most {REASON_LENGTH}"):
            pause("billing", "orders", by="alice", reason=reason)
    with pytest.raises(OperationError, match="must be a string"):
        pause("billing", "orders", reason=None)  # type: ignore[arg-type]
    assert not PausedTopic.objects.exists() and PartitionLease.objects.count() == leases
    assert pause("billing", "orders", reason="é" * REASON_LENGTH) is True
    assert PausedTopic.objects.get().reason == "é" * REASON_LENGTH
