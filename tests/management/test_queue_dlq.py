"""management/commands/queue_dlq.py: paging through dead letters and purging by filter.

More of the command (replay, confirmation, bad arguments): tests/management/test_console_commands.py.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from django_sqlqueue.management.commands import queue_dlq
from django_sqlqueue.models import Message

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def dlq(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_dlq.Command(), *args, stdout=out)
    return out.getvalue()


def test_list_pages_with_the_cursor_it_prints() -> None:
    scene = build()
    first = dlq("list", "--limit", "3").splitlines()
    assert first[-1].startswith("more: --cursor ")
    cursor = first[-1].split()[-1]
    rest = json.loads(dlq("list", "--limit", "3", "--cursor", cursor, "--json"))
    assert [d["seq"] for d in rest["items"]] == [min(scene.dead)] and rest["next_cursor"] is None
    assert len(first) == 1 + 3 + 1  # heading, 3 rows, the cursor line


def test_purge_all_matching_deletes_only_what_the_filters_match() -> None:
    build()
    out = dlq("purge", "--all-matching", "--error", "KeyError", "--yes")
    assert out.startswith("Purged 1 dead letter(s)")
    assert Message.objects.filter(topic="orders_dlq").count() == 3
    assert not Message.objects.filter(topic="orders_dlq", last_error__startswith="builtins.KeyError").exists()
