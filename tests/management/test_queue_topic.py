"""management/commands/queue_topic.py: repartitioning a topic (dry run, then for real).

Listing and purging topics: tests/management/test_console_commands.py.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_sqlqueue.management.commands import queue_topic
from django_sqlqueue.models import Partition

from ..support.console_scene import SETTINGS, build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def topic(*args: str, settings: dict | None = None) -> str:
    out = io.StringIO()
    with override_settings(SQLQUEUE=settings or SETTINGS):
        call_command(queue_topic.Command(), *args, stdout=out)
    return out.getvalue().strip()


FRESH = {**SETTINGS, "TOPICS": {**SETTINGS["TOPICS"], "fresh": {"partitions": 4}}}


def test_repartition_of_a_topic_no_worker_registered_yet() -> None:
    assert topic("repartition", "fresh", "4", "--dry-run", settings=FRESH) == (
        "would change fresh from unregistered to 4 partitions"
    )
    assert not Partition.objects.filter(topic="fresh").exists()
    assert topic("repartition", "fresh", "4", "--yes", settings=FRESH) == (
        "fresh: unregistered -> 4 partitions; restart the workers"
    )
    assert sorted(Partition.objects.filter(topic="fresh").values_list("partition", flat=True)) == [0, 1, 2, 3]


def test_repartition_refuses_a_count_the_settings_do_not_give() -> None:
    build()
    with pytest.raises(CommandError, match=r"SQLQUEUE gives topic 'orders' 2 partitions, not 3"):
        topic("repartition", "orders", "3", "--yes")
    with pytest.raises(CommandError, match="argument partitions: must be an integer from 1 to 4096, got '0'"):
        topic("repartition", "orders", "0", "--yes")
