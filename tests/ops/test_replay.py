"""ops/replay.py: replaying and purging dead letters, one by one or by filter, in batches.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import pytest

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.messages import write_messages
from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import OperationError
from django_sqlqueue.ops.deadletters import DeadLetterFilter, count_dead_letters
from django_sqlqueue.ops.replay import BulkResult, purge, purge_matching, replay, replay_matching
from django_sqlqueue.rules.dlq import REPLAY_KEY, is_for_other_group, replay_id
from django_sqlqueue.rules.limits import MAX_BATCH_SIZE
from django_sqlqueue.rules.validation import PreparedMessage

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


# -- a copy that cannot be written (issue 28, item 2) ------------------------------------------


def take_copy_id(original_id: str, seq: int) -> None:
    """Store a message under the id a replay of dead letter ``seq`` will give its copy, as a
    program writing around publish() (which refuses the id) could."""
    forged = PreparedMessage("k1", replay_id(original_id, seq), '{"attacker":true}', "{}", None, None, True)
    assert write_messages("orders", [forged], using="default")[0].created


def test_a_replay_whose_copy_id_is_taken_rolls_its_batch_back_and_says_so():
    scene = build()
    take_copy_id("o1", scene.dead[1])
    taken = replay_id("o1", scene.dead[1])
    error = (
        rf"replay of dead letter seq {scene.dead[1]} \(id 'billing:o1'\) refused: topic 'orders' already has a "
        rf"message with the copy's id '{taken}', so the copy would not be written; this batch was rolled back "
        r"and its dead letters are kept\."
    )
    with pytest.raises(OperationError, match=error):
        replay(scene.dead[:3], actor="alice")  # one batch: none of it is replayed
    assert count_dead_letters() == 4
    assert list(Message.objects.filter(topic="orders", id__contains="@replay").values_list("id", "payload")) == [
        (taken, {"attacker": True})
    ]


def test_batches_before_the_refused_one_stay_replayed():
    scene = build()
    take_copy_id("o1", scene.dead[1])
    with pytest.raises(OperationError, match=r"rolled back and its dead letters are kept \(1 replayed by earlier"):
        replay(scene.dead[:3], batch_size=1)
    assert count_dead_letters(DeadLetterFilter(group="billing")) == 2  # o0 replayed; o1 kept, o2 never reached
    assert Message.objects.filter(topic="orders", id=replay_id("o0", scene.dead[0])).exists()
    # Newest first: o2 is replayed by the first keyset batch, o1's batch is refused.
    with pytest.raises(OperationError, match=r"seq \d+ \(id 'billing:o1'\) refused.*\(1 replayed by earlier"):
        replay_matching(DeadLetterFilter(group="billing"), batch_size=1)
    assert count_dead_letters(DeadLetterFilter(group="billing")) == 1


# -- sizes (item 4) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size", [0, -1, MAX_BATCH_SIZE + 1, 10**23, pytest.param(10**5000, id="10**5000"), True, 2.5, "5", None]
)
def test_bulk_actions_refuse_a_bad_batch_size_before_anything(size):
    scene = build()
    calls = [
        lambda: replay(scene.dead, batch_size=size),
        lambda: purge(scene.dead, batch_size=size),
        lambda: replay_matching(DeadLetterFilter(), batch_size=size),
        lambda: purge_matching(DeadLetterFilter(), batch_size=size, dry_run=True),
    ]
    for call in calls:
        with pytest.raises(OperationError, match=rf"^batch_size must be an integer from 1 to {MAX_BATCH_SIZE}, got "):
            call()
    assert count_dead_letters() == 4
    assert replay(scene.dead[:1], batch_size=MAX_BATCH_SIZE).done == 1  # the bound itself is a size


# -- the audit hook (item 9) -----------------------------------------------------------------------


def test_on_batch_gets_each_batchs_own_result_inside_its_transaction():
    build()
    seen: list[BulkResult] = []

    def audit(result: BulkResult) -> None:
        # Called after the batch's writes, in its transaction: its copies are there already.
        seen.append(result)
        assert Message.objects.filter(topic="orders", id__contains="@replay").count() == sum(r.done for r in seen)

    total = replay_matching(DeadLetterFilter(group="billing"), batch_size=2, on_batch=audit, actor="cli")
    assert seen == [BulkResult("replay", 2, 0, {"billing": 2}), BulkResult("replay", 1, 0, {"billing": 1})]
    assert total == BulkResult("replay", 3, 0, {"billing": 3})
    replay_matching(DeadLetterFilter(), dry_run=True, on_batch=seen.append)  # a dry run writes nothing to audit
    assert len(seen) == 2


def test_an_error_in_on_batch_rolls_its_batch_back():
    scene = build()
    seen: list[BulkResult] = []

    def audit(result: BulkResult) -> None:
        seen.append(result)
        if len(seen) == 2:
            raise RuntimeError("the audit row could not be written")

    with pytest.raises(RuntimeError):
        purge([*scene.dead, 10**12], batch_size=2, on_batch=audit)
    # The first batch (2 rows) committed with its audit; the second (2 rows and a missing seq) did not.
    assert seen[0] == BulkResult("purge", 2, 0, {"billing": 2})
    assert seen[1] == BulkResult("purge", 2, 0, {"billing": 1, "shipping": 1})
    assert count_dead_letters() == 2
    result = purge(scene.dead, on_batch=seen.append)
    assert (result.done, result.missing) == (2, 2) and seen[2] == BulkResult(
        "purge", 2, 2, {"billing": 1, "shipping": 1}
    )
