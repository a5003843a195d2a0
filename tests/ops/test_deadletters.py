"""ops/deadletters.py: listing, counting and reading dead letters.

On a real database, in the scene of tests/support/console_scene.py (SQLQUEUE of the scene:
the ``scene_settings`` fixture of tests/ops/conftest.py).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.ops.base import NotFound
from django_sqlqueue.ops.deadletters import DeadLetterFilter, count_dead_letters, get_dead_letter, list_dead_letters

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
