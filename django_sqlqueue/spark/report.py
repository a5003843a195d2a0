"""An HTML report of the queue, with plots (``manage.py queue_pipeline report``).

Four sections, each a chart (inline SVG, drawn with matplotlib) and the table behind it:

1. messages per hour per topic (``published_at`` of the last hours), from the counters the
   sequencer keeps as it numbers messages (``queue_topic_hours``): a topic whose messages
   were consumed and garbage-collected still shows; kept ``SQLQUEUE["STATS_RETENTION"]``;
2. consumer lag per group over partitions (``store.lag``: messages published and committed
   that the group has not acked yet, as ``queue_status`` and the console count it);
3. retries (messages waiting for a retry, per group and topic) and dead letters by error
   type (the exception class at the start of ``last_error``, Spark over the DLQ topics);
4. the slowest partitions: the oldest message a group has not processed yet.

The file is self-contained (no scripts, no external assets).
"""

from __future__ import annotations

import datetime as dt
import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .databases import with_database
from .frames import load_messages


@dataclass
class ReportData:
    generated_at: dt.datetime
    hours: int
    #: Start of the first hour of "messages per hour".
    since: dt.datetime | None = None
    per_hour: dict[str, list[tuple[dt.datetime, int]]] = field(default_factory=dict)
    #: (group, topic, partition, lag)
    lag: list[tuple[str, str, int, int]] = field(default_factory=list)
    #: (group, topic, messages waiting for a retry, retries so far)
    retries: list[tuple[str, str, int, int]] = field(default_factory=list)
    #: (dlq topic, error type, count)
    dead_letters: list[tuple[str, str, int]] = field(default_factory=list)
    #: (group, topic, partition, age in seconds of the oldest unprocessed message, lag)
    slowest: list[tuple[str, str, int, float, int]] = field(default_factory=list)


def collect(spark: Any, options: Mapping[str, str], *, hours: int = 48, using: str | None = None) -> ReportData:
    """Gather the report's figures: Spark over the log, plain queries over the small tables."""
    from django.db.models import Count, Sum
    from django.utils import timezone
    from pyspark.sql import functions as F

    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.db.sequencer import sequence
    from django_sqlqueue.db.store import QueueStore
    from django_sqlqueue.models import DeliveryState, Message
    from django_sqlqueue.rules.dlq import is_dlq_topic

    conf = get_settings()
    alias = using or conf.DATABASE
    store = QueueStore(alias)
    now = timezone.now()
    data = ReportData(generated_at=now, hours=hours)
    topics = store.log_topics()
    for topic in topics:
        sequence(topic, using=alias)
    dlq = [t for t in topics if is_dlq_topic(t, conf.DLQ_SUFFIX)]
    since = (now - dt.timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)
    data.since = since
    # The sequencer's counters, not the log: they outlive garbage collection (every topic
    # numbered since, the log's or not). Each (topic, hour) is the sum of its slot rows.
    data.per_hour = store.messages_per_hour(since)
    if dlq:
        errors = (
            load_messages(spark, with_database(options, alias), dlq, engine="python")
            .withColumn(
                "error",
                F.coalesce(F.nullif(F.regexp_extract("last_error", r"^([\w.]+)", 1), F.lit("")), F.lit("(none)")),
            )
            .groupBy("topic", "error")
            .count()
            .orderBy(F.desc("count"))
            .collect()
        )
        data.dead_letters = [(r["topic"], r["error"], int(r["count"])) for r in errors]

    # The store's one definition of lag, as queue_status and the console report it.
    for row in store.lags({(w.group, w.topic) for w in store.watermarks()}):
        data.lag.append((row.group, row.topic, row.partition, row.lag))
        if row.lag:
            oldest = (
                Message.objects.using(alias)
                .filter(topic=row.topic, partition=row.partition, offset__gt=row.watermark)
                .order_by("offset")
                .values_list("published_at", flat=True)
                .first()
            )
            if oldest is not None:
                age = (now - oldest).total_seconds()
                data.slowest.append((row.group, row.topic, row.partition, age, row.lag))
    data.slowest.sort(key=lambda s: -s[3])
    data.slowest = data.slowest[:10]
    retrying = (
        DeliveryState.objects.using(alias)
        .filter(acked=False, retry_count__gt=0)
        .values("consumer_group", "topic")
        .annotate(messages=Count("message_offset"), retries=Sum("retry_count"))
        .order_by("consumer_group", "topic")
    )
    data.retries = [(r["consumer_group"], r["topic"], int(r["messages"]), int(r["retries"] or 0)) for r in retrying]
    return data


# -- drawing --------------------------------------------------------------------------------


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _figure(width: float = 9, height: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def plot_per_hour(data: ReportData) -> str | None:
    if not data.per_hour:
        return None
    import matplotlib.dates as mdates

    fig, ax = _figure()
    start = (data.since or min(p[0] for points in data.per_hour.values() for p in points)).replace(tzinfo=None)
    end = data.generated_at.replace(tzinfo=None, minute=0, second=0, microsecond=0)
    hours = []
    moment = start
    while moment <= end:
        hours.append(moment)
        moment += dt.timedelta(hours=1)
    for topic, points in sorted(data.per_hour.items()):
        counts = {p[0].replace(tzinfo=None): p[1] for p in points}
        # Every hour of the window, zero where nothing was published.
        ax.step(hours, [counts.get(h, 0) for h in hours], where="post", label=topic)
    ax.set_xlim(start, end + dt.timedelta(hours=1))
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:00"))
    ax.set_title("Messages published per hour (UTC)")
    ax.set_ylabel("messages")
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    return _svg(fig)


def plot_lag(data: ReportData) -> str | None:
    if not data.lag:
        return None
    fig, ax = _figure()
    series: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for group, topic, partition, lag in data.lag:
        series.setdefault((group, topic), []).append((partition, lag))
    width = 0.8 / len(series)
    for i, ((group, topic), points) in enumerate(sorted(series.items())):
        ax.bar([p + i * width for p, _ in points], [lag for _, lag in points], width=width, label=f"{group} / {topic}")
    ax.set_title("Consumer lag per group over partitions")
    ax.set_xlabel("partition")
    ax.set_ylabel("messages behind")
    ax.legend(fontsize=8)
    return _svg(fig)


def plot_failures(data: ReportData) -> str | None:
    if not data.dead_letters and not data.retries:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"{g} / {t}" for g, t, _, _ in data.retries]
    left.barh(labels or ["(none)"], [r[2] for r in data.retries] or [0], color="#d9822b")
    left.set_title("Messages waiting for a retry")
    by_error: dict[str, int] = {}
    for _, error, count in data.dead_letters:
        by_error[error] = by_error.get(error, 0) + count
    errors = sorted(by_error.items(), key=lambda e: e[1])
    right.barh([e for e, _ in errors] or ["(none)"], [c for _, c in errors] or [0], color="#c23030")
    right.set_title("Dead letters by error type")
    fig.tight_layout()
    return _svg(fig)


def plot_slowest(data: ReportData) -> str | None:
    if not data.slowest:
        return None
    fig, ax = _figure()
    rows = list(reversed(data.slowest))
    ax.barh([f"{g} / {t}[{p}]" for g, t, p, _, _ in rows], [age / 60 for _, _, _, age, _ in rows], color="#5c7080")
    ax.set_title("Slowest partitions: age of the oldest unprocessed message")
    ax.set_xlabel("minutes")
    return _svg(fig)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "<p class='empty'>Nothing to show.</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(data: ReportData) -> str:
    """Return the report as one self-contained HTML page."""
    sections = []

    def section(anchor: str, title: str, chart: str | None, table: str) -> None:
        figure = f"<figure class='plot' id='plot-{anchor}'>{chart}</figure>" if chart else ""
        sections.append(f"<section id='{anchor}'><h2>{html.escape(title)}</h2>{figure}{table}</section>")

    per_hour_rows = [
        (t, h.strftime("%Y-%m-%d %H:00"), n) for t, points in sorted(data.per_hour.items()) for h, n in points
    ]
    totals = [(t, sum(n for _, n in points), max(n for _, n in points)) for t, points in sorted(data.per_hour.items())]
    section(
        "per-hour",
        f"Messages per hour (last {data.hours} h)",
        plot_per_hour(data),
        "<p class='note'>Counted as the sequencer numbers each message (garbage collection of the log "
        "does not change them). Hours before the upgrade that added the counters hold only the messages "
        "that were still in the log then.</p>"
        + _table(("topic", "messages", "busiest hour"), totals)
        + "<details><summary>Every hour</summary>"
        + _table(("topic", "hour (UTC)", "messages"), per_hour_rows)
        + "</details>",
    )
    section("lag", "Consumer lag per group", plot_lag(data), _table(("group", "topic", "partition", "lag"), data.lag))
    section(
        "failures",
        "Retries and dead letters",
        plot_failures(data),
        _table(("group", "topic", "waiting for retry", "retries"), data.retries)
        + _table(("dead-letter topic", "error type", "messages"), data.dead_letters),
    )
    slow_rows = [(g, t, p, f"{age / 60:.1f} min", lag) for g, t, p, age, lag in data.slowest]
    section(
        "slowest",
        "Slowest partitions",
        plot_slowest(data),
        _table(("group", "topic", "partition", "oldest unprocessed", "lag"), slow_rows),
    )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;color:#182026}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccd;padding:2px 8px;text-align:left}figure.plot{margin:0}.empty{color:#738694}"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Queue report</title>"
        f"<style>{style}</style></head><body><h1>Queue report</h1>"
        f"<p>Generated {html.escape(data.generated_at.strftime('%Y-%m-%d %H:%M UTC'))}.</p>"
        + "".join(sections)
        + "</body></html>"
    )


def write_report(
    spark: Any, options: Mapping[str, str], path: str, *, hours: int = 48, using: str | None = None
) -> ReportData:
    """Collect the figures and write the HTML report to ``path``."""
    data = collect(spark, options, hours=hours, using=using)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(data))
    return data
