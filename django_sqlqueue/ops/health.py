"""Health: the overview's group rows checked against an operator's thresholds (``manage.py queue_health``).

Every threshold is off unless given. A (group, topic) is unhealthy when a measured value
crosses its threshold -- strictly above a maximum, or below one live subscriber with
``require_subscribers``. The values are the overview's (``ops/overview.py``
``group_statuses``), so the console and a probe never disagree:

- ``lag``: messages published and committed that the group has not acked yet, unsequenced
  ones included (``store.lag``, the one definition every report uses).
- ``lag_seconds``: the age, by the database clock, of the oldest message the lag counts
  (``GroupTopicStatus.oldest_unhandled_at``): the earliest publication time among the
  messages right after the group's watermark in each partition and the topic's messages
  still waiting for the sequencer; 0 when nothing is unhandled. A delayed message counts
  from its publication, like its lag. Two grouped statements whatever the number of
  partitions (``ReportStore.oldest_unhandled``, ``ReportStore.oldest_unsequenced``).
- ``dead_letters``: the group's messages in the topic's dead-letter topic, counted up to
  the threshold plus ``COUNT_CAP`` (a capped range of the (topic, id) index).
- ``subscribers``: live subscribers (heartbeat within ``LEASE_DURATION``, not deregistered).

Only (group, topic) pairs are checked: a topic no group consumes has no row -- a dead-letter
topic by design (its dead letters count on the row of the group that failed them, above),
any other topic flagged by the overview instead (``Overview.problems``).

Thresholds come from the command line, or from ``SQLQUEUE["HEALTH"]`` (:func:`configured_thresholds`),
which the console's overview checks too (:func:`overview_problems`).

Each problem prints as one stable line, ``<check> group=<g> topic=<t> value=<v> <max|min>=<n>``
(e.g. ``lag group=billing topic=orders value=120 max=100``), so it can be grepped.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from ..conf import get_settings
from .base import NotFound, OperationError
from .overview import COUNT_CAP, GroupTopicStatus, Overview, group_statuses


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy; None (or False) turns a check off."""

    #: Most messages a (group, topic) may lag behind.
    max_lag: int | None = None
    #: Oldest age, in seconds, of a message a (group, topic) has not handled yet.
    max_lag_seconds: float | None = None
    #: Most dead letters a (group, topic) may have.
    max_dead_letters: int | None = None
    #: Every (group, topic) needs at least one live subscriber.
    require_subscribers: bool = False

    def __post_init__(self) -> None:
        for name in ("max_lag", "max_dead_letters"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise OperationError(f"{name.replace('_', '-')} must be an integer >= 0, got {value!r}.")
        seconds = self.max_lag_seconds
        if seconds is not None and (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not math.isfinite(seconds)
            or seconds < 0
        ):
            raise OperationError(f"max-lag-seconds must be a number of seconds >= 0, got {seconds!r}.")

    @property
    def any(self) -> bool:
        """Whether at least one check is on."""
        return (
            self.max_lag is not None
            or self.max_lag_seconds is not None
            or self.max_dead_letters is not None
            or self.require_subscribers
        )


def configured_thresholds() -> Thresholds:
    """The thresholds of ``SQLQUEUE["HEALTH"]`` (validated by the system check ``sqlqueue.E013``)."""
    health = get_settings().HEALTH
    return Thresholds(
        max_lag=health.get("MAX_LAG"),
        max_lag_seconds=health.get("MAX_LAG_SECONDS"),
        max_dead_letters=health.get("MAX_DEAD_LETTERS"),
        require_subscribers=bool(health.get("REQUIRE_SUBSCRIBERS")),
    )


@dataclass(frozen=True)
class Problem:
    """One threshold crossed by one (group, topic)."""

    #: ``lag``, ``lag_seconds``, ``dead_letters`` or ``subscribers``.
    check: str
    group: str
    topic: str
    value: float
    threshold: float
    #: True when the value is a capped count (at least ``value``).
    capped: bool = False

    @property
    def line(self) -> str:
        """The stable, greppable line ``queue_health`` prints."""
        value = f"{self.value:g}" + ("+" if self.capped else "")
        bound = "min" if self.check == "subscribers" else "max"
        return f"{self.check} group={self.group} topic={self.topic} value={value} {bound}={self.threshold:g}"

    @property
    def label(self) -> str:
        """A short badge: what is over its threshold."""
        return {"lag": "lag", "lag_seconds": "lag age", "dead_letters": "dead letters"}.get(self.check, "no subscriber")

    @property
    def text(self) -> str:
        """The problem in words, for the console."""
        value = f"{self.value:g}" + ("+" if self.capped else "")
        where = f"group {self.group} on {self.topic}"
        if self.check == "lag":
            return f"{where} is {value} message(s) behind (HEALTH MAX_LAG {self.threshold:g})"
        if self.check == "lag_seconds":
            return f"{where}: its oldest unhandled message is {value} s old (HEALTH MAX_LAG_SECONDS {self.threshold:g})"
        if self.check == "dead_letters":
            return f"{where} has {value} dead letter(s) (HEALTH MAX_DEAD_LETTERS {self.threshold:g})"
        return f"{where} has no live subscriber (HEALTH REQUIRE_SUBSCRIBERS)"

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Health:
    """The result of a check: the rows checked and the problems found (none: healthy)."""

    now: dt.datetime
    thresholds: Thresholds
    groups: list[GroupTopicStatus] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


def dead_letter_cap(thresholds: Thresholds) -> int:
    """How far dead letters are counted: far enough past the threshold to tell it was crossed."""
    return COUNT_CAP + (thresholds.max_dead_letters or 0)


def row_problems(row: GroupTopicStatus, thresholds: Thresholds, cap: int = COUNT_CAP) -> list[Problem]:
    """Return the thresholds ``row`` crosses, in a fixed order (lag, lag_seconds, dead_letters, subscribers)."""
    out = []
    if thresholds.max_lag is not None and row.lag > thresholds.max_lag:
        out.append(Problem("lag", row.group, row.topic, row.lag, thresholds.max_lag))
    if thresholds.max_lag_seconds is not None and row.lag_seconds > thresholds.max_lag_seconds:
        # Whole seconds: the line stays short and stable; the comparison is exact.
        out.append(
            Problem("lag_seconds", row.group, row.topic, math.floor(row.lag_seconds), thresholds.max_lag_seconds)
        )
    if thresholds.max_dead_letters is not None and row.dead_letters > thresholds.max_dead_letters:
        out.append(
            Problem(
                "dead_letters",
                row.group,
                row.topic,
                row.dead_letters,
                thresholds.max_dead_letters,
                row.dead_letters > cap,
            )
        )
    if thresholds.require_subscribers and row.live_subscribers < 1:
        out.append(Problem("subscribers", row.group, row.topic, row.live_subscribers, 1))
    return out


def overview_problems(overview: Overview, thresholds: Thresholds) -> list[Problem]:
    """The thresholds the overview's group rows cross (what ``queue_health`` would print for them).

    Build the overview with ``cap=dead_letter_cap(thresholds)`` so that a dead-letter
    threshold above :data:`COUNT_CAP` is still judged on a count that reaches it.
    """
    return [p for row in overview.groups for p in row_problems(row, thresholds, overview.cap)]


def check_health(
    thresholds: Thresholds, *, group: str | None = None, topic: str | None = None, using: str | None = None
) -> Health:
    """Check every (group, topic) -- or those of ``group`` and/or ``topic`` -- against ``thresholds``.

    Raise :class:`NotFound` when ``group`` or ``topic`` is given and nothing matches (a
    typo in a probe must not read as healthy).
    """
    cap = dead_letter_cap(thresholds)
    now, rows = group_statuses(group, topic, using=using, cap=cap)
    if not rows and (group is not None or topic is not None):
        what = " ".join(f"{k} {v!r}" for k, v in (("group", group), ("topic", topic)) if v is not None)
        raise NotFound(f"no consumer group matches {what}: nothing to check.")
    problems = [p for row in rows for p in row_problems(row, thresholds, cap)]
    return Health(now=now, thresholds=thresholds, groups=rows, problems=problems)
