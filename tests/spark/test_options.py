"""Strict options: unknown or misplaced ones are refused naming the valid ones; Kafka names work;
option names are case-insensitive; several topics or a pattern; Trigger.AvailableNow."""

from __future__ import annotations

import json
import time

import pytest
from django.db import connections

from django_sqlqueue.spark.options import SparkOptionError
from django_sqlqueue.spark.optionset import check_options

from .helpers import publish_sequenced, reader, run_to_parquet, stream

pytestmark = pytest.mark.django_db(transaction=True)


def test_check_options_refuses_unknown_and_misplaced_names():
    with pytest.raises(SparkOptionError, match=r"unknown option 'failOnDataLos'\. Valid options: .*failOnDataLoss"):
        check_options({"topic": "t", "failOnDataLos": "true"}, "batch read")
    with pytest.raises(SparkOptionError, match=r"'maxoffsetspertrigger'\. It is an option of a stream read only"):
        check_options({"topic": "t", "maxoffsetspertrigger": "5"}, "batch read")
    with pytest.raises(SparkOptionError, match="Kafka client options"):
        check_options({"topic": "t", "kafka.group.id": "g"}, "stream read")
    with pytest.raises(SparkOptionError, match="same option"):
        check_options({"topic": "t", "maxRecordsPerTrigger": "5", "maxOffsetsPerTrigger": "6"}, "stream read")
    # Aliases and any case resolve to the canonical (lower-cased) name.
    assert check_options({"SUBSCRIBE": "a,b", "MaxRecordsPerTrigger": "5"}, "stream read") == {
        "topic": "a,b",
        "maxoffsetspertrigger": "5",
    }
    with pytest.raises(SparkOptionError, match=r"unknown option 'startTime'\. It is an option of a batch read only"):
        check_options({"topic": "t", "startTime": "2020-01-01"}, "stream read")
    with pytest.raises(SparkOptionError, match=r"unknown option 'group'\. It is an option of a stream read only"):
        check_options({"topic": "t", "group": "g"}, "write")


def test_spark_reads_refuse_unknown_options_and_take_kafka_names(spark, queue_options):
    publish_sequenced("strict", 20, keys=1)
    with pytest.raises(Exception, match="sqlqueue batch read: unknown option 'consumergroup'"):
        reader(spark, queue_options, "strict", consumerGroup="g").collect()
    # The case: a batch read given a stream's option read the whole topic.
    with pytest.raises(Exception, match="option 'startingOffsets' must be earliest or JSON"):
        reader(spark, queue_options, "strict", startingOffsets="10000").collect()
    with pytest.raises(Exception, match=r"unknown option 'maxoffsetspertrigger'\. It is an option of a stream read"):
        reader(spark, queue_options, "strict", maxOffsetsPerTrigger="5").collect()
    # Names in any case; Kafka's names.
    assert reader(spark, queue_options, "strict", STARTINGOFFSET="15").count() == 6
    partition = str(reader(spark, queue_options, "strict").first().partition)
    ranged = reader(
        spark,
        queue_options,
        "strict",
        startingOffsets=json.dumps({partition: 4}),
        endingOffsets=json.dumps({partition: 8}),
    )
    assert sorted(r.offset for r in ranged.collect()) == [5, 6, 7, 8]
    query = stream(spark, queue_options, "strict", startTime="2020-01-01T00:00:00").writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match="sqlqueue stream read: unknown option 'starttime'"):
            query.processAllAvailable()
    finally:
        query.stop()


def test_several_topics_and_a_pattern(spark, queue_options, tmp_path):
    publish_sequenced("pat.a", 5, keys=2)
    publish_sequenced("pat.b", 7, keys=2)
    publish_sequenced("other", 3)
    pattern = spark.read.format("sqlqueue").options(**queue_options).option("subscribePattern", r"pat\..*").load()
    assert sorted(r.topic for r in pattern.select("topic").distinct().collect()) == ["pat.a", "pat.b"]
    assert pattern.count() == 12
    df = spark.readStream.format("sqlqueue").options(**queue_options).option("subscribe", "pat.a,pat.b").load()
    progress = run_to_parquet(df, tmp_path / "out", tmp_path / "checkpoint")
    assert spark.read.parquet(str(tmp_path / "out")).count() == 12
    end = json.loads(progress[-1]["sources"][0]["endOffset"])
    assert sorted(end) == ["pat.a", "pat.b"] and sum(sum(parts.values()) for parts in end.values()) == 12
    connections.close_all()


def test_trigger_available_now_stops_by_itself(spark, queue_options, tmp_path):
    publish_sequenced("avail", 20, keys=3)
    query = (
        stream(spark, queue_options, "avail", maxOffsetsPerTrigger="7")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 20 and max(sizes) <= 7
    assert spark.read.parquet(str(tmp_path / "out")).count() == 20
    connections.close_all()


def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(spark, queue_options, tmp_path):
    publish_sequenced("trickle", 5, keys=1)
    query = (
        stream(spark, queue_options, "trickle", minOffsetsPerTrigger="10", maxTriggerDelay="4s")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        started = time.monotonic()
        time.sleep(1.5)
        assert sum(p["numInputRows"] for p in query.recentProgress) == 0  # fewer than 10: waits
        while time.monotonic() - started < 60 and sum(p["numInputRows"] for p in query.recentProgress) < 5:
            time.sleep(0.25)
        assert sum(p["numInputRows"] for p in query.recentProgress) == 5  # the delay passed: read anyway
        assert time.monotonic() - started >= 3.5
    finally:
        query.stop()
    connections.close_all()


def test_starting_timestamp_batch_and_stream(spark, queue_options, tmp_path):
    """Kafka's startingTimestamp (ms since the epoch, or ISO 8601) and startingOffsetsByTimestamp:
    the read starts at the first message published at or after the time."""
    import datetime as dt

    from django.utils import timezone

    from django_sqlqueue.models import Message

    publish_sequenced("stamped", 10, keys=1)
    old = timezone.now() - dt.timedelta(hours=2)
    Message.objects.filter(topic="stamped", offset__lte=4).update(published_at=old)
    cutoff = timezone.now() - dt.timedelta(hours=1)
    millis = str(int(cutoff.timestamp() * 1000))
    partition = str(Message.objects.filter(topic="stamped").first().partition)

    assert sorted(
        r.offset for r in reader(spark, queue_options, "stamped", startingTimestamp=millis).collect()
    ) == list(range(5, 11))
    by_partition = json.dumps({"stamped": {partition: cutoff.isoformat()}})
    df = reader(spark, queue_options, "stamped", startingOffsetsByTimestamp=by_partition)
    assert df.count() == 6
    with pytest.raises(Exception, match="not both"):
        reader(spark, queue_options, "stamped", startingTimestamp=millis, startingOffset="2").collect()

    run_to_parquet(stream(spark, queue_options, "stamped", startingTimestamp=millis), tmp_path / "out", tmp_path / "cp")
    assert sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(5, 11))
    connections.close_all()
