"""ops/pausing.py: pausing and resuming a group on a topic.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.models import PartitionLease, PausedTopic
from django_sqlqueue.ops.pausing import pause, paused_topics, resume

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
