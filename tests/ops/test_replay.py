"""ops/replay.py: replaying and purging dead letters, one by one or by filter, in batches.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.deadletters import DeadLetterFilter, count_dead_letters
from django_sqlqueue.ops.replay import purge, purge_matching, replay, replay_matching
from django_sqlqueue.rules.dlq import REPLAY_KEY, is_for_other_group

from ..support import console_scene
from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_replay_copies_to_the_original_topic_for_the_failing_group_only():
    scene = build()
    result = replay([scene.dead[0]], actor="alice")
    assert (result.done, result.missing, result.by_group) == (1, 0, {"billing": 1})
    assert not Message.objects.filter(seq=scene.dead[0]).exists()
    copy = Message.objects.get(topic="orders", id=f"o0@replay{scene.dead[0]}")
    marker = copy.metadata[REPLAY_KEY]
    assert marker["consumer_group"] == "billing" and marker["original_id"] == "o0" and marker["replays"] == 1
    assert copy.metadata["trace"] == "abc" and "dead_letter" not in copy.metadata
    assert copy.payload == {"order": "o0"} and copy.key == "k1" and copy.offset is None
    assert not is_for_other_group(copy.metadata, "billing") and is_for_other_group(copy.metadata, "shipping")
    sequence("orders")  # the copy becomes deliverable like any message
    copy.refresh_from_db()
    assert copy.offset is not None


def test_replay_works_after_the_original_was_collected_and_twice_is_once():
    scene = build()
    Message.objects.filter(topic="orders", id="o1").delete()
    assert replay([scene.dead[1]]).done == 1
    again = replay([scene.dead[1]])
    assert (again.done, again.missing) == (0, 1)
    assert Message.objects.filter(topic="orders", id__startswith="o1@replay").count() == 1


def test_replay_of_a_replayed_message_that_failed_again_keeps_the_first_original_id():
    scene = build()
    replay([scene.dead[0]])
    copy = Message.objects.get(topic="orders", id=f"o0@replay{scene.dead[0]}")
    second = console_scene.dead_letter("billing", copy.id)
    Message.objects.filter(seq=second).update(metadata={**copy.metadata, "dead_letter": {"consumer_group": "billing"}})
    replay([second])
    third = Message.objects.get(topic="orders", id=f"o0@replay{second}")
    assert third.metadata[REPLAY_KEY]["replays"] == 2


def test_bulk_replay_and_purge_matching_in_batches():
    build()
    f = DeadLetterFilter(topic="orders", group="billing")
    assert replay_matching(f, dry_run=True, batch_size=2).done == 3
    assert count_dead_letters(f) == 3
    result = replay_matching(f, batch_size=2, actor="cli")
    assert result.done == 3 and count_dead_letters(f) == 0
    assert Message.objects.filter(topic="orders", id__contains="@replay").count() == 3
    purged = purge_matching(DeadLetterFilter())
    assert purged.done == 1 and count_dead_letters() == 0


def test_bulk_selection_validates_input():
    build()
    with pytest.raises(OperationError, match="no dead letter selected"):
        replay([])
    with pytest.raises(OperationError, match="integers"):
        purge(["x"])
