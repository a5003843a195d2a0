"""management/commands/queue_group.py: pausing and resuming say what changed; seeking by time and
by chosen partitions. More of the command: tests/management/test_console_commands.py."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_sqlqueue.management.commands import queue_group
from django_sqlqueue.models import ConsumerOffset, PausedTopic

from ..support.console_scene import build, wm

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def group(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_group.Command(), *args, stdout=out)
    return out.getvalue().strip()


def test_pause_and_resume_say_when_nothing_changed() -> None:
    build()
    assert group("resume", "billing", "orders") == "was not paused"
    assert group("pause", "billing", "orders", "--reason", "deploy") == "paused billing on orders"
    assert group("pause", "billing", "orders") == "already paused"
    assert PausedTopic.objects.get().reason == "deploy"
    assert group("resume", "billing", "orders") == "resumed billing on orders"


def test_seek_by_time_on_chosen_partitions() -> None:
    scene = build()
    an_hour_ago = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    out = group("seek", "shipping", "orders", "--to-time", an_hour_ago, "--partitions", "1", "--yes")
    assert "redelivered" in out
    assert wm("shipping", 1) == 0 and wm("shipping", 0) == scene.heads[0]  # partition 0 untouched
    with pytest.raises(CommandError, match="partition"):
        group("seek", "shipping", "orders", "--to-earliest", "--partitions", "zero", "--yes")
    assert ConsumerOffset.objects.get(consumer_group="shipping", partition=1).offset_acked == 0
