"""Issue 32: the ``queue_*`` commands with the queue in two databases (``second.*`` in ``second``).

``--database ALIAS`` chooses one (an unknown alias is a CommandError naming the known ones);
without it a listing reads every database and names each row's, and an action on a topic
runs in the topic's database.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue.management.commands import queue_dlq, queue_gc, queue_group, queue_topic
from django_sqlqueue.models import ConsumerOffset, PausedTopic

from ..support.databases_scene import GROUP, TOPICS, Scene, topics_of

pytestmark = pytest.mark.django_db(databases=["default", "second"])

FIRST, SECOND = TOPICS["default"], TOPICS["second"]


@pytest.fixture
def scene(two_databases: Scene) -> Scene:
    return two_databases


def run(command: Any, *args: str) -> str:
    out = io.StringIO()
    call_command(command.Command(), *args, stdout=out)
    return out.getvalue().strip()


@pytest.mark.parametrize(
    "command, args",
    [
        (queue_group, ("list",)),
        (queue_group, ("pause", GROUP, "first.orders")),
        (queue_topic, ("list",)),
        (queue_topic, ("purge", "first.orders", "--dry-run")),
        (queue_dlq, ("list",)),
        (queue_gc, ()),
    ],
)
def test_an_unknown_database_is_refused_naming_the_known_ones(scene: Scene, command: Any, args: tuple) -> None:
    with pytest.raises(CommandError, match=r"--database third: not a database of the queue \(known: default, second"):
        run(command, *args, "--database", "third")


def test_group_list_names_each_rows_database(scene: Scene) -> None:
    lines = run(queue_group, "list").splitlines()
    assert lines[0].split()[:3] == ["database", "group", "topic"]
    assert [line.split()[:3] for line in lines[1:]] == [["default", GROUP, FIRST], ["second", GROUP, SECOND]]
    assert [g["database"] for g in json.loads(run(queue_group, "list", "--json"))] == ["default", "second"]
    only = run(queue_group, "list", "--database", "second")
    assert "database" not in only and SECOND in only and FIRST not in only
    assert FIRST not in run(queue_group, "list", "--topic", SECOND)
    parts = json.loads(run(queue_group, "list", "--partitions", "--json"))
    assert set(parts) == {f"default/{GROUP}:{FIRST}", f"second/{GROUP}:{SECOND}"}


def test_group_actions_run_in_the_topics_database(scene: Scene) -> None:
    assert run(queue_group, "pause", GROUP, SECOND) == f"paused {GROUP} on {SECOND}"
    assert list(PausedTopic.objects.using("second").values_list("topic", flat=True)) == [SECOND]
    assert not PausedTopic.objects.using("default").exists()
    # --database overrides the topic's own (a topic moved between databases).
    assert run(queue_group, "resume", GROUP, SECOND, "--database", "default") == "was not paused"
    assert run(queue_group, "resume", GROUP, SECOND) == f"resumed {GROUP} on {SECOND}"

    run(queue_group, "seek", GROUP, SECOND, "--to-latest", "--yes")
    assert ConsumerOffset.objects.using("second").get().offset_acked == 3
    assert ConsumerOffset.objects.using("default").get().offset_acked == 0

    out = run(queue_group, "drop", GROUP, "--dry-run")
    assert "in database(s): default, second" in out
    run(queue_group, "drop", GROUP, "--database", "second", "--yes")
    assert not ConsumerOffset.objects.using("second").exists() and ConsumerOffset.objects.using("default").exists()


def test_topic_list_and_purge(scene: Scene) -> None:
    lines = run(queue_topic, "list").splitlines()
    assert lines[0].split()[0] == "database"
    assert {tuple(line.split()[:2]) for line in lines[1:]} == {
        ("default", FIRST),
        ("default", f"{FIRST}_dlq"),
        ("second", SECOND),
        ("second", f"{SECOND}_dlq"),
    }
    assert run(queue_topic, "purge", SECOND, "--dry-run") == f"would delete 3 message(s) of {SECOND}"
    run(queue_topic, "purge", SECOND, "--yes")
    assert topics_of("second") == [f"{SECOND}_dlq"] and len(topics_of("default")) == 4


def test_dlq_list_names_the_database_and_a_seq_needs_one(scene: Scene) -> None:
    lines = run(queue_dlq, "list").splitlines()
    assert lines[0].split()[:2] == ["database", "seq"]
    assert [line.split()[:2] for line in lines[1:]] == [
        ["default", str(scene.dead["default"])],
        ["second", str(scene.dead["second"])],
    ]
    items = json.loads(run(queue_dlq, "list", "--json"))["items"]
    assert [(d["database"], d["original_topic"]) for d in items] == [("default", FIRST), ("second", SECOND)]
    assert SECOND in run(queue_dlq, "list", "--topic", SECOND) and "database" not in run(
        queue_dlq, "list", "--topic", SECOND
    )
    with pytest.raises(CommandError, match="seqs are per database; pass --database"):
        run(queue_dlq, "replay", "--seq", str(scene.dead["second"]), "--yes")
    with pytest.raises(CommandError, match="--cursor continues one database's list"):
        run(queue_dlq, "list", "--cursor", "10")

    out = run(queue_dlq, "replay", "--seq", str(scene.dead["second"]), "--database", "second", "--yes")
    assert out.startswith("Replayed 1")
    assert topics_of("second") == [SECOND] * 4 and f"{FIRST}_dlq" in topics_of("default")
    out = run(queue_dlq, "purge", "--all-matching", "--yes")
    assert out.splitlines() == [
        f"database=default: purged 1 dead letter(s) ({GROUP}: 1).",
        "database=second: purged 0 dead letter(s).",
    ]


def test_gc_collects_every_database_and_says_which(scene: Scene) -> None:
    for topic in TOPICS.values():
        run(queue_group, "seek", GROUP, topic, "--to-latest", "--yes")
    out = run(queue_gc, "--database", "second")
    assert out.splitlines() == [f"{SECOND}: deleted 3 message(s)", "deleted 3 message(s) in 1 topic(s)"]
    assert topics_of("second") == [f"{SECOND}_dlq"] and len(topics_of("default")) == 4
    out = run(queue_gc, "-v", "2")
    assert out.splitlines() == [
        f"database=default {FIRST}: deleted 3 message(s)",
        f"database=second {SECOND}: deleted 0 message(s)",
        "deleted 3 message(s) in 2 topic(s) in 2 databases",
    ]
    assert topics_of("default") == [f"{FIRST}_dlq"]
