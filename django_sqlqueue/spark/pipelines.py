"""The queue's Spark pipelines: backfill, export, replay (``manage.py queue_pipeline``).

Each takes a SparkSession and the data source options (:func:`sqlqueue_options`), so it
runs the same on ``local[*]`` and on a cluster. The report is in ``report.py``.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .databases import chosen_alias
from .frames import load_messages
from .options import SparkOptionError

SOURCE_FORMATS = ("parquet", "json", "csv")


@dataclass(frozen=True)
class BackfillResult:
    rows: int
    published: int


def backfill(
    spark: Any,
    options: Mapping[str, str],
    *,
    source: str,
    topic: str,
    fmt: str = "parquet",
    id_column: str | None = None,
    key_column: str | None = None,
    payload_column: str | None = None,
    batch_size: int = 2000,
) -> BackfillResult:
    """Publish the rows of files (Parquet, JSON lines or CSV with a header) to ``topic``.

    The payload is ``payload_column`` (a struct, or a JSON string) or, by default, a
    struct of every column but the id and key columns. Without ``id_column`` the ids
    are content hashes (identical rows become one message). Re-running a backfill
    publishes nothing twice.
    """
    from django_sqlqueue.models import Message

    if fmt not in SOURCE_FORMATS:
        raise SparkOptionError(f"source format must be one of {', '.join(SOURCE_FORMATS)}, got {fmt!r}.")
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    df = reader.load(source)
    for name in (id_column, key_column, payload_column):
        if name and name not in df.columns:
            raise SparkOptionError(f"the source has no column {name!r} (columns: {', '.join(df.columns)}).")
    from pyspark.sql import functions as F

    rest = [c for c in df.columns if c not in (id_column, key_column)]
    payload = F.col(payload_column) if payload_column else F.struct(*[F.col(c) for c in rest])
    selected = [payload.alias("payload")]
    if key_column:
        selected.append(F.col(key_column).cast("string").alias("key"))
    if id_column:
        selected.append(F.col(id_column).cast("string").alias("id"))
    out = df.select(*selected)
    alias = chosen_alias(options, [topic], _alias())  # where the write goes: the topic's database
    before = Message.objects.using(alias).filter(topic=topic).count()
    writer = out.write.format("sqlqueue").options(**options).option("topic", topic).option("batchSize", str(batch_size))
    if not id_column:
        writer = writer.option("idMode", "content")
    with progress(spark, f"backfill {topic}"):
        writer.mode("append").save()
    after = Message.objects.using(alias).filter(topic=topic).count()
    return BackfillResult(rows=df.count(), published=after - before)


def export(
    spark: Any,
    options: Mapping[str, str],
    *,
    topics: Sequence[str],
    output: str,
    engine: str = "auto",
    start_time: dt.datetime | None = None,
    end_time: dt.datetime | None = None,
    overwrite: bool = False,
) -> dict[str, int]:
    """Write the messages of ``topics`` to Parquet under ``output/topic=<t>/date=<d>/``.

    Only the ``(topic, date)`` directories being written are replaced with
    ``overwrite`` (dynamic partition overwrite); without it, an existing output is an
    error. Returns the number of messages written per topic.
    """
    from pyspark.sql import functions as F

    df = load_messages(spark, options, topics, engine=engine, start_time=start_time, end_time=end_time)
    df = df.withColumn("date", F.to_date("published_at"))
    mode = "overwrite" if overwrite else "errorifexists"
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    with progress(spark, "export"):
        df.write.mode(mode).partitionBy("topic", "date").parquet(output)
    written = spark.read.parquet(output).where(F.col("topic").isin(list(topics)))
    if start_time or end_time:
        if start_time:
            written = written.where(F.col("published_at") >= F.lit(start_time))
        if end_time:
            written = written.where(F.col("published_at") < F.lit(end_time))
    return {row["topic"]: int(row["count"]) for row in written.groupBy("topic").count().collect()}


def replay_to_topic(
    spark: Any,
    options: Mapping[str, str],
    *,
    topic: str,
    target: str,
    start_time: dt.datetime | None,
    end_time: dt.datetime | None,
) -> int:
    """Publish the messages of ``topic`` published in ``[start_time, end_time)`` to ``target``.

    Keys and payloads are kept; the id is ``replay:<sha256(topic:id)>`` so a replay run
    again publishes nothing twice; metadata gets ``replayed_from`` (topic, partition,
    offset, id) and the original metadata as JSON text.
    """
    if topic == target:
        raise SparkOptionError("replay: the target topic must differ from the source topic.")
    df = load_messages(spark, options, [topic], engine="python", start_time=start_time, end_time=end_time)
    out = df.selectExpr(
        "key",
        "payload",
        "concat('replay:', sha2(concat(topic, ':', id), 256)) AS id",
        "named_struct('replayed_from', named_struct('topic', topic, 'partition', `partition`, 'offset', `offset`, "
        "'id', id), 'original_metadata', metadata) AS metadata",
    )
    with progress(spark, f"replay {topic} -> {target}"):
        out.write.format("sqlqueue").options(**options).option("topic", target).mode("append").save()
    return int(df.count())


def replay_to_group(topic: str, group: str, start_time: dt.datetime, *, using: str | None = None) -> dict[int, int]:
    """Start a *new* consumer group at the first message of ``topic`` published at or after ``start_time``.

    Runs no Spark: it sequences the topic, then writes the group's watermark rows
    (``queue_offsets``) just below that message in every partition
    (:meth:`~django_sqlqueue.db.store.positions.PositionStore.start_group`); its workers
    then consume from there on (a group has no end). A partition without such a
    message starts at its head. Refuses a group that already has watermarks on the
    topic. Returns ``{partition: watermark}``.
    """
    from django_sqlqueue.db.sequencer import sequence
    from django_sqlqueue.db.store import QueueStore
    from django_sqlqueue.rules.validation import validate_group

    validate_group(group)
    alias = using or _alias(topic)
    sequence(topic, using=alias)
    marks = QueueStore(alias).start_group(group, topic, start_time)
    if marks is None:
        raise SparkOptionError(f"consumer group {group!r} already consumes {topic!r}: replay into a new group name.")
    return marks


def _alias(topic: str | None = None) -> str:
    """The alias of ``topic``'s database (its route), or ``SQLQUEUE["DATABASE"]``."""
    from django_sqlqueue.conf import get_settings

    conf = get_settings()
    return conf.DATABASE if topic is None else conf.database_for(topic)


@contextmanager
def progress(spark: Any, what: str, report: Callable[[str], None] | None = None, every: float = 2.0) -> Any:
    """Report the running job's task progress every ``every`` seconds while the block runs."""
    report = report or (lambda line: print(line, flush=True))
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()

    def watch() -> None:
        last = ""
        while not done.wait(every):
            parts = []
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info:
                    parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
            line = f"{what}: {', '.join(parts)}" if parts else ""
            if line and line != last:
                report(line)
                last = line

    thread = threading.Thread(target=watch, name="sqlqueue-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
