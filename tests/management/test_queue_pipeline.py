"""management/commands/queue_pipeline.py: what runs without Spark -- starting a new group at a
time (``replay --group``) -- and the arguments refused before a Spark session starts.

The Spark pipelines themselves (backfill, export, replay into a topic, report): tests/spark/test_pipelines.py.
"""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_sqlqueue.management.commands import queue_pipeline
from django_sqlqueue.models import ConsumerOffset

from ..support.console_scene import build

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def pipeline(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_pipeline.Command(), *args, stdout=out)
    return out.getvalue().strip()


def test_replay_into_a_new_group_starts_it_at_the_time_and_refuses_an_existing_one() -> None:
    build()
    since = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    out = pipeline("replay", "--topic", "orders", "--since", since, "--group", "audit", "--yes")
    assert out == "replay: group 'audit' starts 'orders' in 2 partition(s)"
    marks = ConsumerOffset.objects.filter(consumer_group="audit", topic="orders").values_list("offset_acked", flat=True)
    assert sorted(marks) == [0, 0]  # every message is newer than an hour: all of them again
    with pytest.raises(CommandError, match="consumer group 'billing' already consumes 'orders'"):
        pipeline("replay", "--topic", "orders", "--since", since, "--group", "billing", "--yes")
    with pytest.raises(CommandError, match="--until applies to --to-topic only"):
        pipeline("replay", "--topic", "orders", "--since", since, "--until", since, "--group", "late", "--yes")
    assert not ConsumerOffset.objects.filter(consumer_group="late").exists()


def test_bad_times_and_spark_settings_are_refused_before_spark_starts() -> None:
    with pytest.raises(CommandError, match=r"argument --since: must be an ISO 8601 date and time .*, got 'soon'"):
        pipeline("replay", "--topic", "orders", "--since", "soon", "--group", "audit", "--yes")
    with pytest.raises(CommandError, match=r"argument --conf: must be KEY=VALUE, got 'spark\.executor\.memory'"):
        pipeline("report", "--output", "/nonexistent/report.html", "--conf", "spark.executor.memory")
