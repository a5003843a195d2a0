"""ops/deadletters.py: listing, counting and reading dead letters.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import NotFound, OperationError
from django_sqlqueue.ops.deadletters import DeadLetterFilter, count_dead_letters, get_dead_letter, list_dead_letters
from django_sqlqueue.rules.limits import MAX_LIST_LIMIT

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def test_dead_letter_list_filters_and_detail():
    scene = build()
    page = list_dead_letters()
    assert [d.seq for d in page.items] == sorted(scene.dead, reverse=True)
    assert {d.group for d in list_dead_letters(DeadLetterFilter(group="billing")).items} == {"billing"}
    keyerrors = list_dead_letters(DeadLetterFilter(error="KeyError")).items
    assert [d.original_id for d in keyerrors] == ["o7"] and keyerrors[0].error_class == "builtins.KeyError"
    assert count_dead_letters(DeadLetterFilter(topic="orders", error="builtins.ValueError")) == 3
    assert count_dead_letters(DeadLetterFilter(failed_after=timezone.now() + dt.timedelta(minutes=1))) == 0
    d = get_dead_letter(scene.dead[0])
    assert d.group == "billing" and "Traceback" in d.last_error and d.payload == {"order": "o0"}
    with pytest.raises(NotFound):
        get_dead_letter(Message.objects.get(topic="orders", id="o1").seq)  # not a dead letter


@pytest.mark.parametrize("limit", [0, -5, MAX_LIST_LIMIT + 1, 10**23, True, "5", None])
def test_list_refuses_a_bad_limit(limit):
    """``queue_dlq list --limit -5`` and ``--limit 10**23`` ended in tracebacks."""
    build()
    with pytest.raises(OperationError, match=rf"^limit must be an integer from 1 to {MAX_LIST_LIMIT}, got "):
        list_dead_letters(limit=limit)
    assert len(list_dead_letters(limit=MAX_LIST_LIMIT).items) == 4


@pytest.mark.parametrize("cursor", [2**63, -(2**63), 10**23, "5", 1.5])
def test_list_refuses_a_cursor_that_is_no_seq(cursor):
    build()
    with pytest.raises(OperationError, match=r"^cursor must be a seq, an integer of at most 9223372036854775807"):
        list_dead_letters(cursor=cursor)
    assert list_dead_letters(cursor=2**63 - 1).items  # the largest seq is a cursor


def test_a_seq_out_of_range_is_no_dead_letter():
    with pytest.raises(NotFound, match="no dead letter with seq"):
        get_dead_letter(10**23)
