"""Issue 32: the operator services with the queue in two databases (``second.*`` in ``second``).

Operations on a topic run in the topic's database; listings without a topic read every
database and name each row's; ``using=`` and ``ops.on_database`` choose one.
"""

from __future__ import annotations

import pytest

from django_sqlqueue import ops
from django_sqlqueue.models import ConsumerOffset, Message, PausedTopic
from django_sqlqueue.ops.base import listing_aliases, topic_alias
from django_sqlqueue.ops.gc import collect_garbage

from ..support.databases_scene import GROUP, TOPICS, Scene, topics_of

pytestmark = pytest.mark.django_db(databases=["default", "second"])

FIRST, SECOND = TOPICS["default"], TOPICS["second"]


@pytest.fixture
def scene(two_databases: Scene) -> Scene:
    return two_databases


def pairs(rows: list) -> list[tuple[str, str, str]]:
    return [(r.database, r.group, r.topic) for r in rows]


def test_which_database_a_service_runs_on(scene: Scene) -> None:
    assert topic_alias(SECOND) == "second" and topic_alias(f"{SECOND}_dlq") == "second"
    assert topic_alias(FIRST) == "default" and topic_alias(SECOND, "default") == "default"
    assert listing_aliases() == ["default", "second"] and listing_aliases(SECOND) == ["second"]
    with ops.on_database("second"):
        assert topic_alias(FIRST) == "second" and listing_aliases() == ["second"]
    with pytest.raises(ops.NotFound, match=r"'third' is not a database of the queue \(known: default, second"):
        with ops.on_database("third"):
            pass


def test_listings_cover_every_database_and_name_each_rows(scene: Scene) -> None:
    assert pairs(ops.list_groups()) == [("default", GROUP, FIRST), ("second", GROUP, SECOND)]
    assert pairs(ops.list_groups(topic=SECOND)) == [("second", GROUP, SECOND)]
    assert pairs(ops.list_groups(using="default")) == [("default", GROUP, FIRST)]
    assert [g.lag for g in ops.list_groups()] == [3, 3]
    topics = {(t.database, t.topic) for t in ops.list_topics()}
    assert topics == {("default", FIRST), ("default", f"{FIRST}_dlq"), ("second", SECOND), ("second", f"{SECOND}_dlq")}
    assert [t.topic for t in ops.list_topics(using="second")] == [SECOND, f"{SECOND}_dlq"]
    # A group's offsets come from its topic's database.
    (partition,) = ops.group_offsets(GROUP, SECOND)
    assert (partition.head, partition.watermark, partition.lag) == (3, 0, 3)
    with ops.on_database("second"):
        overview = ops.overview()
        assert overview.database == "second"
        assert [(g.group, g.topic) for g in overview.groups] == [(GROUP, SECOND)]
    assert ops.overview().database == "default"


def test_pausing_and_seeking_act_in_the_topics_database(scene: Scene) -> None:
    assert ops.pause(GROUP, SECOND, by="alice", reason="deploy")
    assert PausedTopic.objects.using("second").filter(topic=SECOND).exists()
    assert not PausedTopic.objects.using("default").exists()
    assert [(p.database, p.topic) for p in ops.paused_topics()] == [("second", SECOND)]
    assert ops.resume(GROUP, SECOND)
    assert not PausedTopic.objects.using("second").exists()

    plan = ops.seek(GROUP, SECOND, position="latest")
    assert plan.skip == 3
    marks = {alias: list(ConsumerOffset.objects.using(alias).values_list("topic", "offset_acked")) for alias in TOPICS}
    assert marks == {"default": [(FIRST, 0)], "second": [(SECOND, 3)]}


def test_dead_letters_are_read_and_replayed_in_their_database(scene: Scene) -> None:
    listed = ops.list_dead_letters(ops.DeadLetterFilter(topic=SECOND)).items
    assert [(d.seq, d.original_topic) for d in listed] == [(scene.dead["second"], SECOND)]
    assert ops.count_dead_letters(ops.DeadLetterFilter(group=GROUP)) == 1  # default's, without a topic
    assert ops.count_dead_letters(ops.DeadLetterFilter(group=GROUP), using="second") == 1
    assert ops.get_dead_letter(scene.dead["second"], using="second").original_topic == SECOND

    result = ops.replay_matching(ops.DeadLetterFilter(topic=SECOND), actor="alice")
    assert result.done == 1
    assert topics_of("second") == [SECOND] * 4  # the replayed copy, in its topic's database
    assert topics_of("default") == [FIRST] * 3 + [f"{FIRST}_dlq"]  # untouched

    # By seq: a seq is a position in one database's log, chosen with using=.
    assert ops.purge([scene.dead["default"]], actor="alice", using="default").done == 1
    assert topics_of("default") == [FIRST] * 3


def test_messages_of_a_topic_are_browsed_in_its_database(scene: Scene) -> None:
    page = ops.browse(ops.MessageFilter(topic=SECOND))
    assert {m.id for m in page.items} == {"second-0", "second-1", "second-2"}
    seq = page.items[0].seq
    assert ops.get_message(seq, using="second").topic == SECOND


def test_purging_a_topic_and_dropping_a_group_reach_every_database(scene: Scene) -> None:
    assert ops.purge_topic(SECOND).messages == 3
    assert topics_of("second") == [f"{SECOND}_dlq"] and len(topics_of("default")) == 4

    preview = ops.drop_group(GROUP, dry_run=True)
    assert preview.databases == ["default", "second"]
    done = ops.drop_group(GROUP)
    assert done.databases == ["default", "second"] and done.rows["queue_offsets"] == 2
    assert not ConsumerOffset.objects.using("default").exists()
    assert not ConsumerOffset.objects.using("second").exists()
    with pytest.raises(ops.NotFound, match="has no rows"):
        ops.drop_group(GROUP)


def test_garbage_collection_runs_in_every_database(scene: Scene) -> None:
    for topic in TOPICS.values():
        ops.seek(GROUP, topic, position="latest")
    assert collect_garbage(using="second") == {SECOND: 3}
    assert Message.objects.using("default").filter(topic=FIRST).count() == 3
    assert collect_garbage(topics=[FIRST]) == {FIRST: 3}
    assert topics_of("default") == [f"{FIRST}_dlq"] and topics_of("second") == [f"{SECOND}_dlq"]


def test_garbage_collection_without_arguments_covers_every_database(scene: Scene) -> None:
    for topic in TOPICS.values():
        ops.seek(GROUP, topic, position="latest")
    assert collect_garbage() == {FIRST: 3, SECOND: 3}
    assert topics_of("default") == [f"{FIRST}_dlq"] and topics_of("second") == [f"{SECOND}_dlq"]
