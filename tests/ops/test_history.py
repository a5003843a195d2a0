"""The history read for the console (django_sqlqueue/ops/history.py): buckets over the
window on real ``queue_history`` rows, the topic's published counts joined to each group,
gaps where no lag was sampled, and the "since when behind, catching up?" summary."""

from __future__ import annotations

import datetime as dt

import pytest

from django_sqlqueue import ops
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.models import HistoryMinute
from django_sqlqueue.ops.history import WINDOWS

pytestmark = pytest.mark.django_db


def now_minute() -> int:
    return QueueStore("default").now_minute()


def add(group: str, topic: str, minute: int, slot: int = 0, **counts: int) -> None:
    HistoryMinute.objects.create(consumer_group=group, topic=topic, minute=minute, slot=slot, **counts)


def test_the_last_hour_has_one_point_per_minute_with_slots_summed_and_published_joined():
    now = now_minute()
    add("g", "t", now - 2, 0, handled=3, failed=1, retried=1, lag=40)
    add("g", "t", now - 2, 1, handled=4, dead_lettered=2)
    add("", "t", now - 2, 3, published=9)
    add("other", "t", now - 2, 0, handled=100, lag=7)  # another group's: not g's
    add("g", "t", now - 61, 0, handled=50, lag=1)  # outside the hour
    series = ops.group_history("g", "t", "1h")
    assert len(series.points) == 60 and series.step == 1
    assert series.points[-1].at == dt.datetime.fromtimestamp(now * 60, dt.UTC)
    p = series.points[-3]
    assert (p.published, p.handled, p.failed, p.retried, p.dead_lettered, p.lag) == (9, 7, 1, 1, 2, 40)
    assert sum(x.handled for x in series.points) == 7
    assert [x.lag for x in series.points if x.lag is not None] == [40]  # the rest are gaps
    assert series.totals().handled == 7 and series.totals().lag == 40


@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_window_buckets_its_minutes(window):
    minutes, step = WINDOWS[window]
    now = now_minute()
    add("g", "w", now - minutes + step, handled=1, lag=5)
    add("g", "w", now, handled=2, lag=6)
    series = ops.group_history("g", "w", window)
    assert len(series.points) == minutes // step
    assert series.points[-1].handled == 2 and series.points[-1].lag == 6
    assert sum(p.handled for p in series.points) == 3


def test_a_buckets_lag_is_its_last_sampled_minutes():
    now = now_minute()
    start = now - now % 15 - 15  # the previous whole bucket of 15 minutes
    add("g", "b", start + 14, lag=20)
    add("g", "b", start + 2, lag=90)
    add("g", "b", start + 7, handled=4)
    point = ops.group_history("g", "b", "24h").points[-2]
    assert point.at == dt.datetime.fromtimestamp(start * 60, dt.UTC)
    assert (point.lag, point.handled) == (20, 4)


def test_a_bad_window_is_refused():
    with pytest.raises(ops.OperationError, match="window must be one of 1h, 24h, 7d"):
        ops.group_history("g", "t", "1y")


def test_the_summary_says_since_when_the_group_is_behind_and_whether_it_catches_up():
    now = now_minute()
    lags = {30: 0, 29: 0, 28: 120, 20: 900, 10: 800, 5: 600, 1: 400}
    for age, lag in lags.items():
        add("g", "s", now - age, lag=lag)
    summary = ops.summarize(ops.group_history("g", "s", "1h"))
    assert summary.lag == 400
    assert summary.behind_since == dt.datetime.fromtimestamp((now - 28) * 60, dt.UTC)
    assert summary.trend_per_minute is not None and summary.trend_per_minute < 0
    assert summary.minutes_to_zero is not None and 0 < summary.minutes_to_zero < 60
    text = summary.describe()
    assert text.startswith("Behind since ") and "catching up" in text


def test_the_summary_of_a_group_falling_behind_and_of_one_that_is_not():
    now = now_minute()
    for age, lag in {20: 10, 10: 200, 1: 900}.items():
        add("g", "up", now - age, lag=lag)
        add("g", "ok", now - age, lag=0)
    falling = ops.summarize(ops.group_history("g", "up", "1h"))
    assert falling.trend_per_minute and falling.trend_per_minute > 0 and falling.minutes_to_zero is None
    assert "falling further behind" in falling.describe()
    ok = ops.summarize(ops.group_history("g", "ok", "1h"))
    assert ok.behind_since is None and ok.describe().startswith("Not behind")
    none = ops.summarize(ops.group_history("g", "never", "1h"))
    assert none.lag is None and "no worker was running" in none.describe()


def test_many_pairs_at_once_and_the_bound():
    now = now_minute()
    pairs = [(f"g{i}", "many") for i in range(20)]
    for g, t in pairs:
        add(g, t, now, handled=int(g[1:]), lag=1)
    got = ops.histories(pairs, "1h")
    assert {pair: got[pair].points[-1].handled for pair in pairs} == {(g, t): int(g[1:]) for g, t in pairs}
    with pytest.raises(ops.OperationError, match="at most 200"):
        ops.histories([(f"g{i}", "t") for i in range(201)])
