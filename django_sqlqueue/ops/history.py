"""The history of a consumer group on a topic, minute by minute: what the console charts.

Read from ``queue_history`` (``db/store/history.py``): the group's running totals and lag
at each minute's last sample. A minute's figures are the growth of the totals since the
previous sample -- the messages its topic got (``published``: numbered by the sequencer),
the group handled, failed, retried and dead-lettered -- counted at the minute of the
sample (a sampler runs every 20 s, so within that of the work). A total that went down
(the group dropped and started again) starts over from 0. A window is bucketed so that a
chart has at most a few hundred points (:data:`WINDOWS`); every bucket of the window is
returned, those without a sample as zeros with no lag, so a stretch without any running
worker shows as a gap, not a line (its work counts at the first sample after it).

:func:`summarize` answers the operator's question from the series alone: since when the
group is behind, and whether it is catching up (and when it would be done at this pace).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..db.store.history import MINUTE, Sample
from .base import OperationError, store, topic_alias

#: Window name -> (minutes, minutes per bucket): 60, 96 and 168 points.
WINDOWS: dict[str, tuple[int, int]] = {"1h": (60, 1), "24h": (24 * 60, 15), "7d": (7 * 24 * 60, 60)}
#: Pairs one overview read takes at most (the overview's sparkline per group and topic).
MAX_PAIRS = 200
#: Minutes before a window read for its first sample's baseline.
LOOKBACK = 60
#: Minutes of samples the summary's trend (catching up or falling behind) is taken over.
TREND_MINUTES = 15


@dataclass(frozen=True)
class Point:
    """One bucket: its start (UTC), its counts, and its last lag sample (None: none taken)."""

    at: dt.datetime
    published: int = 0
    handled: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lag: int | None = None


@dataclass(frozen=True)
class Series:
    group: str
    topic: str
    window: str
    #: Minutes per bucket.
    step: int
    points: list[Point]

    def totals(self) -> Point:
        """The window's sums (and its last lag sample)."""
        lags = [p.lag for p in self.points if p.lag is not None]
        return Point(
            self.points[0].at if self.points else dt.datetime.now(dt.UTC),
            sum(p.published for p in self.points),
            sum(p.handled for p in self.points),
            sum(p.failed for p in self.points),
            sum(p.retried for p in self.points),
            sum(p.dead_lettered for p in self.points),
            lags[-1] if lags else None,
        )


@dataclass(frozen=True)
class Summary:
    """Since when the group is behind, and whether it is catching up."""

    #: The last lag sample (None: no sample in the window).
    lag: int | None
    #: Start of the current run of buckets with a lag above 0 (None: not behind).
    behind_since: dt.datetime | None
    #: Lag change per minute over the last quarter of the window (negative: catching up).
    trend_per_minute: float | None
    #: Minutes until the lag reaches 0 at that pace (None: not catching up, or not behind).
    minutes_to_zero: float | None

    def describe(self) -> str:
        if self.lag is None:
            return "No lag sample in this window: no worker was running."
        if self.behind_since is None:
            return "Not behind: every message published was handled."
        text = f"Behind since {self.behind_since:%Y-%m-%d %H:%M} UTC, lag {self.lag:,}"
        if self.trend_per_minute is None:
            return text + "."
        if self.trend_per_minute < 0 and self.minutes_to_zero is not None:
            return text + (
                f", catching up by {-self.trend_per_minute:,.0f}/min: about {self.minutes_to_zero:,.0f} min "
                "to go at this pace."
            )
        if self.trend_per_minute > 0:
            return text + f", falling further behind by {self.trend_per_minute:,.0f}/min."
        return text + ", not catching up (lag flat)."


def _window(window: str) -> tuple[int, int]:
    try:
        return WINDOWS[window]
    except (KeyError, TypeError):
        raise OperationError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}.") from None


def _at(minute: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(minute * MINUTE, dt.UTC)


def histories(
    pairs: Iterable[tuple[str, str]], window: str = "1h", *, using: str | None = None
) -> dict[tuple[str, str], Series]:
    """The series of each (group, topic) over ``window`` (``WINDOWS``), up to this minute.

    Each pair's from its topic's database (or ``using``, or the chosen one: :mod:`.base`).
    """
    minutes, step = _window(window)
    wanted = sorted(set(pairs))
    if len(wanted) > MAX_PAIRS:
        raise OperationError(f"at most {MAX_PAIRS} (group, topic) pairs at once, got {len(wanted)}.")
    by_database: dict[str, list[tuple[str, str]]] = {}
    for pair in wanted:
        by_database.setdefault(topic_alias(pair[1], using), []).append(pair)
    out: dict[tuple[str, str], Series] = {}
    for db, some in by_database.items():
        out.update(_histories(some, window, minutes, step, db))
    return out


def _histories(
    wanted: list[tuple[str, str]], window: str, minutes: int, step: int, using: str
) -> dict[tuple[str, str], Series]:
    s = store(using)
    now = s.now_minute()
    last = now - now % step
    first = last - (minutes // step - 1) * step
    # The samples of the window, and the hour before it for the first one's baseline.
    samples = s.samples(wanted, first - max(LOOKBACK, step), now + 1, step)
    out = {}
    for pair in wanted:
        buckets: dict[int, list[int]] = {}
        lags: dict[int, int] = {}
        for minute, figures, lag in _per_minute(samples.get(pair, [])):
            if minute < first:
                continue
            b = minute - minute % step
            sums = buckets.setdefault(b, [0] * 5)
            for i, v in enumerate(figures):
                sums[i] += v
            lags[b] = lag  # in minute order: the bucket's last sample
        points = []
        for b in range(first, last + 1, step):
            if b in lags:
                published, handled, failed, retried, dead = buckets[b]
                points.append(Point(_at(b), published, handled, failed, retried, dead, lags[b]))
            else:
                points.append(Point(_at(b)))
        out[pair] = Series(pair[0], pair[1], window, step, points)
    return out


def _per_minute(samples: Sequence[Sample]) -> Iterable[tuple[int, tuple[int, ...], int]]:
    """(minute, figures since the previous sample, lag) of each sample after the first."""
    previous: Sample | None = None
    for sample in samples:
        if previous is not None:
            figures = tuple(
                _growth(getattr(previous, name), getattr(sample, name))
                for name in ("published", "handled", "failed", "retried", "dead_lettered")
            )
            yield sample.minute, figures, sample.lag
        else:
            yield sample.minute, (0, 0, 0, 0, 0), sample.lag
        previous = sample


def _growth(before: int, after: int) -> int:
    """How much a running total grew; one that went down started over (from 0)."""
    return after - before if after >= before else after


def group_history(group: str, topic: str, window: str = "1h", *, using: str | None = None) -> Series:
    """The series of ``group`` on ``topic`` over ``window`` ("1h", "24h" or "7d")."""
    return histories([(group, topic)], window, using=using)[(group, topic)]


def summarize(series: Series) -> Summary:
    """Since when the group is behind (within ``series``) and how fast the lag moves, from
    ``series`` alone: the trend is the lag's change over its last ``TREND_MINUTES``."""
    sampled = [p for p in series.points if p.lag is not None]
    if not sampled:
        return Summary(None, None, None, None)
    lag = sampled[-1].lag
    assert lag is not None
    behind_since = None
    if lag > 0:
        behind_since = sampled[-1].at
        for p in reversed(sampled):
            if not p.lag:
                break
            behind_since = p.at
    cutoff = sampled[-1].at - dt.timedelta(minutes=TREND_MINUTES)
    tail = [p for p in sampled if p.at >= cutoff]
    if len(tail) < 2:
        tail = sampled[-2:]
    trend = None
    if len(tail) >= 2:
        minutes = (tail[-1].at - tail[0].at).total_seconds() / MINUTE
        if minutes > 0:
            trend = ((tail[-1].lag or 0) - (tail[0].lag or 0)) / minutes
    to_zero = lag / -trend if trend is not None and trend < 0 and lag > 0 else None
    return Summary(lag, behind_since, trend, to_zero)


def group_summary(group: str, topic: str, *, hour: Series | None = None, using: str | None = None) -> Summary:
    """The operator's answer for ``group`` on ``topic``: the lag and its trend over the last
    minutes (from the last hour, ``hour`` if already read), and since when it is behind,
    looked up over 24 h and then 7 days when it has been behind for the whole shorter window."""
    hour = hour if hour is not None else group_history(group, topic, "1h", using=using)
    summary = summarize(hour)
    shorter = hour
    for window in ("24h", "7d"):
        first = next((p.at for p in shorter.points if p.lag is not None), None)
        if summary.behind_since is None or first is None or summary.behind_since > first:
            break
        shorter = group_history(group, topic, window, using=using)
        longer = summarize(shorter).behind_since
        if longer is not None and longer < summary.behind_since:
            summary = replace(summary, behind_since=longer)
    return summary
