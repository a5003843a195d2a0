"""spark/report.py: the report's figures, gathered from a real queue, and its HTML page."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import ConsumerOffset, Message
from django_sqlqueue.spark.report import ReportData, collect, render

from ..support.console_scene import dead_letter
from .helpers import publish_sequenced

pytestmark = pytest.mark.django_db(transaction=True)


def test_collect_counts_messages_per_hour_lag_and_dead_letters_by_error(spark, queue_options) -> None:
    publish_sequenced("report.t", 6, keys=1)
    (partition,) = set(Message.objects.filter(topic="report.t").values_list("partition", flat=True))  # one key
    ConsumerOffset.objects.create(
        consumer_group="g", topic="report.t", partition=partition, offset_acked=2, updated_at=timezone.now()
    )
    dead_letter("g", "m0", topic="report.t")
    dead_letter("g", "m1", topic="report.t", error="KeyError")
    dead_letter("g", "m2", topic="report.t", error="KeyError")
    data = collect(spark, queue_options, hours=2)
    assert sum(n for _, n in data.per_hour["report.t"]) == 6
    assert sorted(data.dead_letters) == [
        ("report.t_dlq", "builtins.KeyError", 2),
        ("report.t_dlq", "builtins.ValueError", 1),
    ]
    assert [(g, t, lag) for g, t, _, lag in data.lag] == [("g", "report.t", 4)]
    assert [s[0] for s in data.slowest] == ["g"]


def test_the_page_escapes_what_it_shows_and_says_when_there_is_nothing() -> None:
    now = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
    page = render(ReportData(generated_at=now, hours=2, dead_letters=[("t_dlq", "<script>x</script>", 1)]))
    assert page.startswith("<!DOCTYPE html>") and "Generated 2026-01-31 12:00 UTC." in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>" not in page
    assert "<p class='empty'>Nothing to show.</p>" in page  # no lag, no retries
    assert "<svg" in page  # the dead letters' chart
