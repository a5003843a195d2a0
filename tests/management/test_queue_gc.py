"""management/commands/queue_gc.py: what a topic nobody consumes, and an empty queue, give.

The watermark cases (per topic, --verbosity 2): tests/management/test_commands.py.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from django_sqlqueue.management.commands import queue_gc
from django_sqlqueue.models import Message

from ..support.engine_helpers import publish_to, store

pytestmark = pytest.mark.django_db(transaction=True)


def gc(*args: str) -> list[str]:
    out = io.StringIO()
    call_command(queue_gc.Command(), *args, stdout=out)
    return out.getvalue().splitlines()


def test_an_empty_queue_reports_nothing_deleted() -> None:
    assert gc() == ["deleted 0 message(s) in 0 topic(s)"]


def test_a_topic_no_group_consumes_is_never_collected() -> None:
    publish_to("gc.nobody", 0, 4)
    store().register_topic("gc.nobody", 8)
    assert gc("--verbosity", "2") == ["gc.nobody: deleted 0 message(s)", "deleted 0 message(s) in 1 topic(s)"]
    assert Message.objects.filter(topic="gc.nobody").count() == 4
