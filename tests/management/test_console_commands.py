"""queue_dlq, queue_group, queue_topic (and queue_status's unconsumed topics), in-process."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_sqlqueue import ops
from django_sqlqueue.models import ConsumerOffset, Message, PausedTopic

from ..support.console_scene import SETTINGS, build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


@pytest.fixture
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_dlq_list_table_and_json():
    scene = build()
    text = run("queue_dlq", "list", "--group", "billing")
    assert "builtins.ValueError" in text and "shipping" not in text
    data = json.loads(run("queue_dlq", "list", "--json", "--limit", "2"))
    assert [d["seq"] for d in data["items"]] == sorted(scene.dead, reverse=True)[:2] and data["next_cursor"]


def test_dlq_replay_dry_run_then_for_real():
    scene = build()
    assert "Would be replayed 3 dead letter(s)" in run(
        "queue_dlq", "replay", "--all-matching", "--group", "billing", "--dry-run"
    )
    assert ops.count_dead_letters() == 4
    out = json.loads(run("queue_dlq", "replay", "--seq", str(scene.dead[0]), "--yes", "--json"))
    assert out["done"] == 1 and out["by_group"] == {"billing": 1}
    assert ops.count_dead_letters() == 3


def test_destructive_commands_need_confirmation_without_a_terminal():
    scene = build()
    with pytest.raises(CommandError, match="--yes"):
        run("queue_dlq", "purge", "--seq", str(scene.dead[0]))
    with pytest.raises(CommandError, match="--yes"):
        run("queue_topic", "purge", "typo")
    with pytest.raises(CommandError, match="--yes"):
        run("queue_group", "seek", "billing", "orders", "--to-earliest")
    assert ops.count_dead_letters() == 4 and Message.objects.filter(topic="typo").count() == 3
    assert "Purged 1" in run("queue_dlq", "purge", "--seq", str(scene.dead[0]), "--noinput")


def test_dlq_bad_arguments():
    build()
    with pytest.raises(CommandError, match="either --seq"):
        run("queue_dlq", "replay", "--yes")
    with pytest.raises(CommandError, match="argument --failed-after: must be an ISO 8601 date and time"):
        run("queue_dlq", "list", "--failed-after", "soon")


def test_group_list_pause_resume():
    build()
    assert "retired" in run("queue_group", "list")
    rows = json.loads(run("queue_group", "list", "--json"))
    assert {r["group"]: r["lag"] for r in rows} == {"billing": 4, "retired": 20, "shipping": 0}
    assert "watermark" in run("queue_group", "list", "--partitions", "--group", "billing")
    assert "paused billing" in run("queue_group", "pause", "billing", "orders", "--reason", "deploy")
    assert PausedTopic.objects.get().paused_by == "cli"
    assert "resumed" in run("queue_group", "resume", "billing", "orders")


def test_group_seek_and_drop():
    build()
    preview = run("queue_group", "seek", "shipping", "orders", "--to-earliest", "--dry-run")
    assert "20 message(s) redelivered" in preview
    assert all(o.offset_acked > 0 for o in ConsumerOffset.objects.filter(consumer_group="shipping"))
    run("queue_group", "seek", "shipping", "orders", "--to-offset", "0", "--partitions", "0", "--yes")
    assert ConsumerOffset.objects.get(consumer_group="shipping", partition=0).offset_acked == 0
    with pytest.raises(CommandError, match="beyond the head"):
        run("queue_group", "seek", "shipping", "orders", "--to-offset", "9999", "--yes")
    with pytest.raises(CommandError, match="live subscriber"):
        run("queue_group", "drop", "billing", "--yes")
    assert "queue_offsets: 2" in run("queue_group", "drop", "retired", "--dry-run")
    run("queue_group", "drop", "retired", "--yes")
    assert not ConsumerOffset.objects.filter(consumer_group="retired").exists()


def test_group_seek_to_earliest_creates_an_unknown_group():
    build()
    preview = run("queue_group", "seek", "newcomer", "orders", "--to-earliest", "--dry-run")
    assert "group 'newcomer' had no watermarks on 'orders' and will be created" in preview
    assert not ConsumerOffset.objects.filter(consumer_group="newcomer").exists()
    done = run("queue_group", "seek", "newcomer", "orders", "--to-earliest", "--yes")
    assert "and is created at these positions" in done
    assert ConsumerOffset.objects.filter(consumer_group="newcomer", topic="orders").count() >= 1


def test_topic_list_and_purge():
    build()
    text = run("queue_topic", "list", "--unconsumed")
    assert "typo" in text and "NOBODY" in text and "billing" not in text
    assert json.loads(run("queue_topic", "list", "--json"))[0]["topic"] == "orders"
    assert "would delete 3" in run("queue_topic", "purge", "typo", "--dry-run")
    run("queue_topic", "purge", "typo", "--yes")
    assert not Message.objects.filter(topic="typo").exists()
    with pytest.raises(CommandError, match="no messages and no consumer"):
        run("queue_topic", "purge", "typo", "--yes")


def test_queue_status_lists_topics_nobody_consumes():
    build()
    text = run("queue_status")
    # A dead-letter topic is consumed by no group by design (issue 29): listed apart, not as orphaned.
    assert "topics nobody consumes (never collected): typo\n" in text
    assert "dead-letter topics (kept until replayed or purged): orders_dlq" in text
