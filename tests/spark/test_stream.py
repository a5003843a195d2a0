"""The sqlqueue data source, streaming side: offsets are the queue's offsets, a late
committing publisher is never skipped, restart from checkpoint, admission control, and an
exactly-once sink with a replayed micro-batch."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from django.db import connections, transaction

from django_sqlqueue.models import Message
from django_sqlqueue.publisher import publish, publish_many

from ..support.engine_helpers import not_on_sqlite
from .helpers import publish_sequenced, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _stream(spark, options, topic, **extra):
    return spark.readStream.format("sqlqueue").options(**options).option("topic", topic).options(**extra).load()


def _run_to_parquet(df, out: Path, checkpoint: Path):
    query = (
        df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint)).start()
    )
    try:
        query.processAllAvailable()
        return list(query.recentProgress)
    finally:
        query.stop()


@not_on_sqlite("a late commit needs two writing transactions open at once")
def test_stream_never_skips_a_late_commit_and_restarts_from_checkpoint(spark, queue_options, tmp_path, spawn):
    # No worker consumes "events": the stream runs the sequencer itself.
    publish_many("events", [{"payload": {"n": i}, "key": "a", "id": f"early{i}"} for i in range(10)])

    opened, release = threading.Event(), threading.Event()

    def late_publisher():
        with transaction.atomic():
            publish("events", {"n": "late"}, key="a", id="late")
            opened.set()
            assert release.wait(60)

    late = spawn(late_publisher, "late")
    assert opened.wait(10)
    # Published (and committed) after the late message was inserted: a later seq.
    publish_many("events", [{"payload": {"n": i}, "key": "a", "id": f"after{i}"} for i in range(5)])

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_to_parquet(_stream(spark, queue_options, "events"), out, checkpoint)
    first = spark.read.parquet(str(out)).collect()
    assert sorted(r.id for r in first) == sorted([f"early{i}" for i in range(10)] + [f"after{i}" for i in range(5)])
    assert sorted(r.offset for r in first) == list(range(1, 16))

    release.set()
    late.join_ok()
    publish_many("events", [{"payload": {"n": i}, "key": "a", "id": f"more{i}"} for i in range(3)])

    # The same checkpoint: the restarted query continues after offset 15.
    progress = _run_to_parquet(_stream(spark, queue_options, "events"), out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)) == 19
    assert "late" in ids
    late_row = next(r for r in rows if r.id == "late")
    assert late_row.offset == 16  # numbered when it became visible, after the ones that committed first
    assert sum(p["numInputRows"] for p in progress) == 4
    assert json.loads(progress[-1]["sources"][0]["endOffset"]) == {str(late_row.partition): 19}


def test_stream_admission_control_limits_rows_per_micro_batch(spark, queue_options, tmp_path):
    publish_sequenced("limited", 40, keys=8)
    df = _stream(spark, queue_options, "limited", maxRecordsPerTrigger="7")
    progress = _run_to_parquet(df, tmp_path / "out", tmp_path / "checkpoint")
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sum(sizes) == 40
    assert max(sizes) <= 7 and len(sizes) >= 6
    assert spark.read.parquet(str(tmp_path / "out")).select("id").distinct().count() == 40


def test_stream_starting_offsets_latest_and_explicit(spark, queue_options, tmp_path):
    publish_sequenced("positioned", 10, keys=1)
    partition = str(Message.objects.filter(topic="positioned").first().partition)
    df = _stream(spark, queue_options, "positioned", startingOffsets=json.dumps({partition: 6}))
    _run_to_parquet(df, tmp_path / "out", tmp_path / "checkpoint")
    assert sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect()) == [7, 8, 9, 10]


def test_stream_write_is_exactly_once_when_a_micro_batch_is_replayed(spark, queue_options, tmp_path):
    """A stream from one topic into another, without ids: the sink names rows by batch id,
    task partition and position. Deleting the last commit of the checkpoint makes Spark
    run that micro-batch again on restart (same id, same offsets): nothing is stored twice."""
    publish_sequenced("source", 30, keys=3)
    checkpoint = tmp_path / "checkpoint"

    def run():
        df = _stream(spark, queue_options, "source", maxRecordsPerTrigger="12").selectExpr("key", "payload")
        query = (
            df.writeStream.format("sqlqueue")
            .options(**queue_options)
            .option("topic", "copy")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            query.processAllAvailable()
            return query.recentProgress
        finally:
            query.stop()

    run()
    copied = stored("copy")
    assert len(copied) == 30
    assert sorted(m["payload"]["n"] for m in copied) == list(range(30))
    # <idPrefix>:<batch id>:<task partition>:<position>: the batch id reached the executors.
    assert all(re.fullmatch(r"copy:\d+:\d+:\d+", m["id"]) for m in copied)
    assert len({m["id"].split(":")[1] for m in copied}) >= 3  # 30 rows, 12 per micro-batch

    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    os.remove(last)
    crc = checkpoint / "commits" / f".{last.name}.crc"
    if crc.exists():
        os.remove(crc)
    progress = run()
    assert [p["batchId"] for p in progress if p["numInputRows"]] == [int(last.name)]  # replayed
    assert stored("copy") == copied
    connections.close_all()


def test_a_read_limit_is_shared_round_robin_between_the_partitions_with_new_messages() -> None:
    """stream.admit: maxRowsPerTrigger spread so that one busy partition cannot starve the others."""
    from django_sqlqueue.spark.stream import admit

    latest = {0: 100, 1: 3, 2: 10, 3: 0}
    assert admit({}, latest, 9) == {0: 3, 1: 3, 2: 3, 3: 0}
    assert admit({0: 90, 1: 3}, latest, 100) == latest  # everything there is, no more
    assert admit({0: 90, 1: 3, 2: 9}, latest, 4) == {0: 93, 1: 3, 2: 10, 3: 0}
    assert sum(admit({}, latest, 50).values()) == 50
