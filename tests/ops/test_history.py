"""The history read for the console (django_sqlqueue/ops/history.py): per-minute figures
from consecutive samples of real ``queue_history`` rows, bucketed over the window, gaps
where no sample was taken, totals that start over, and the "since when behind, catching
up?" summary."""

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


def sample(group: str, topic: str, minute: int, **totals: int) -> None:
    HistoryMinute.objects.create(consumer_group=group, topic=topic, minute=minute, **totals)


def test_a_minutes_figures_are_the_growth_of_the_totals_since_the_previous_sample():
    now = now_minute()
    sample("g", "t", now - 3, published=100, handled=50, failed=1, retried=1, lag=50)
    sample("g", "t", now - 2, published=109, handled=57, failed=2, retried=1, dead_lettered=1, lag=45)
    sample("g", "t", now, published=110, handled=70, failed=2, retried=1, dead_lettered=1, lag=30)
    sample("other", "t", now - 2, handled=1000, lag=7)  # another group's: not g's
    series = ops.group_history("g", "t", "1h")
    assert len(series.points) == 60 and series.step == 1
    assert series.points[-1].at == dt.datetime.fromtimestamp(now * 60, dt.UTC)
    p = series.points[-3]
    assert (p.published, p.handled, p.failed, p.retried, p.dead_lettered, p.lag) == (9, 7, 1, 0, 1, 45)
    assert series.points[-2].lag is None  # no sample: a gap
    assert (series.points[-1].handled, series.points[-1].lag) == (13, 30)
    assert series.points[-4].handled == 0 and series.points[-4].lag == 50  # the first sample: a baseline
    assert series.totals().handled == 20 and series.totals().lag == 30


def test_the_first_sample_of_the_window_counts_from_the_one_before_it():
    now = now_minute()
    sample("g", "b", now - 70, handled=10)  # before the hour: the baseline only
    sample("g", "b", now - 30, handled=25, lag=1)
    assert sum(p.handled for p in ops.group_history("g", "b", "1h").points) == 15


def test_a_total_that_went_down_started_over():
    now = now_minute()
    sample("g", "r", now - 5, handled=500)
    sample("g", "r", now - 4, handled=20)  # the group was dropped and started again
    assert ops.group_history("g", "r", "1h").points[-5].handled == 20


@pytest.mark.parametrize("window", list(WINDOWS))
def test_every_window_buckets_its_minutes(window):
    minutes, step = WINDOWS[window]
    now = now_minute()
    sample("g", "w", now - minutes + step, handled=1, lag=5)
    sample("g", "w", now, handled=3, lag=6)
    series = ops.group_history("g", "w", window)
    assert len(series.points) == minutes // step
    assert series.points[-1].handled == 2 and series.points[-1].lag == 6
    assert sum(p.handled for p in series.points) == 2


def test_a_buckets_figures_are_summed_and_its_lag_is_its_last_samples():
    now = now_minute()
    start = now - now % 15 - 15  # the previous whole bucket of 15 minutes
    sample("g", "q", start - 1, handled=0)
    sample("g", "q", start + 2, handled=4, lag=90)
    sample("g", "q", start + 14, handled=10, lag=20)
    point = ops.group_history("g", "q", "24h").points[-2]
    assert point.at == dt.datetime.fromtimestamp(start * 60, dt.UTC)
    assert (point.lag, point.handled) == (20, 10)


def test_a_bad_window_is_refused():
    with pytest.raises(ops.OperationError, match="window must be one of 1h, 24h, 7d"):
        ops.group_history("g", "t", "1y")


def test_the_summary_says_since_when_the_group_is_behind_and_whether_it_catches_up():
    now = now_minute()
    lags = {30: 0, 29: 0, 28: 120, 20: 900, 10: 800, 5: 600, 1: 400}
    for age, lag in lags.items():
        sample("g", "s", now - age, lag=lag)
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
        sample("g", "up", now - age, lag=lag)
        sample("g", "ok", now - age, lag=0)
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
        sample(g, t, now - 1, handled=0, lag=1)
        sample(g, t, now, handled=int(g[1:]), lag=1)
    got = ops.histories(pairs, "1h")
    assert {pair: got[pair].points[-1].handled for pair in pairs} == {(g, t): int(g[1:]) for g, t in pairs}
    with pytest.raises(ops.OperationError, match="at most 200"):
        ops.histories([(f"g{i}", "t") for i in range(201)])


def test_the_groups_answer_looks_back_past_the_hour_when_it_was_behind_all_of_it():
    now = now_minute()
    for age in range(200, -1, -1):  # behind since 180 minutes ago, catching up by 10/min lately
        lag = 0 if age > 180 else 5000 - max(0, 30 - age) * 10
        sample("g", "long", now - age, lag=lag)
    summary = ops.group_summary("g", "long")
    since = dt.datetime.fromtimestamp(now * 60, dt.UTC) - summary.behind_since
    assert dt.timedelta(minutes=180) <= since <= dt.timedelta(minutes=195)  # the 24 h view's 15-minute buckets
    assert summary.trend_per_minute == pytest.approx(-10) and summary.minutes_to_zero == pytest.approx(470)
    # Behind for a part of the hour only: the hour says since when, to the minute.
    for age in range(25, -1, -1):
        sample("g", "short", now - age, lag=0 if age > 18 else 100)
    short = ops.group_summary("g", "short")
    assert short.behind_since == dt.datetime.fromtimestamp((now - 18) * 60, dt.UTC)
    assert short.trend_per_minute == 0 and "not catching up" in short.describe()
