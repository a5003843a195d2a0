"""The sqlqueue data source, batch side: parallel reads by partition and offset range, and
idempotent bulk publish (run twice, a killed and retried task, bad input)."""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import time
from collections import Counter

import pytest
from django.db import connection
from django.utils import timezone

from django_sqlqueue.conf import get_settings
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store.messages import write_dead_letter
from django_sqlqueue.exceptions import InvalidMessage
from django_sqlqueue.models import Message
from django_sqlqueue.rules.partitioning import partition_for

from .helpers import publish_sequenced, reader, stored

pytestmark = pytest.mark.django_db(transaction=True)


def test_read_is_split_by_partition_and_offset_range(spark, queue_options):
    publish_sequenced("orders", 300, keys=7)
    per_partition = Counter(Message.objects.filter(topic="orders").values_list("partition", flat=True))
    assert len(per_partition) > 1

    df = reader(spark, queue_options, "orders", rowsPerSplit="20")
    expected_splits = sum(math.ceil(n / 20) for n in per_partition.values())
    assert df.rdd.getNumPartitions() == expected_splits
    rows = df.collect()
    assert len(rows) == 300
    assert sorted(r.id for r in rows) == sorted(f"m{i}" for i in range(300))
    by_id = {m["id"]: m for m in stored("orders")}
    for r in rows:
        assert (r.partition, r.offset, r.key) == (by_id[r.id]["partition"], by_id[r.id]["offset"], by_id[r.id]["key"])
        assert r.payload == f'{{"n":{int(r.id[1:])}}}'
    # Every partition's offsets are 1..n, each read once.
    for partition, n in per_partition.items():
        assert sorted(r.offset for r in rows if r.partition == partition) == list(range(1, n + 1))


def test_read_offset_and_time_ranges(spark, queue_options):
    publish_sequenced("orders", 120, keys=4)
    old = timezone.now() - dt.timedelta(hours=3)
    Message.objects.filter(topic="orders", id__in=[f"m{i}" for i in range(40)]).update(published_at=old)

    ranged = reader(spark, queue_options, "orders", startingOffset="5", endingOffset="10").collect()
    per_partition = Counter(r.partition for r in ranged)
    assert set(per_partition.values()) == {6}
    assert all(5 <= r.offset <= 10 for r in ranged)

    cutoff = (timezone.now() - dt.timedelta(hours=1)).isoformat()
    recent = reader(spark, queue_options, "orders", startTime=cutoff).collect()
    assert sorted(r.id for r in recent) == sorted(f"m{i}" for i in range(40, 120))
    older = reader(spark, queue_options, "orders", endTime=cutoff).collect()
    assert sorted(r.id for r in older) == sorted(f"m{i}" for i in range(40))
    assert reader(spark, queue_options, "orders", partitions="1,2").select("partition").distinct().count() <= 2


def test_read_sequences_unsequenced_messages_first(spark, queue_options):
    from django_sqlqueue.publisher import publish_many

    publish_many("fresh", [{"payload": {"n": i}, "key": str(i), "id": str(i)} for i in range(25)])
    assert Message.objects.filter(topic="fresh", offset__isnull=True).count() == 25
    assert reader(spark, queue_options, "fresh").count() == 25
    assert reader(spark, queue_options, "fresh2", sequence="false").count() == 0


def test_read_parses_payload_with_a_schema(spark, queue_options):
    publish_sequenced("orders", 10)
    df = reader(spark, queue_options, "orders", payloadSchema="struct<n: int>")
    assert dict(df.schema["payload"].dataType.jsonValue()["fields"][0])["type"] == "integer"
    assert sorted(r.payload.n for r in df.collect()) == list(range(10))


def test_read_dead_letter_topic_with_failure_columns(spark, queue_options):
    for i in range(3):
        write_dead_letter(
            "orders_dlq",
            key=f"k{i}",
            id=f"billing:m{i}",
            payload={"n": i},
            metadata={"dead_letter": {"consumer_group": "billing", "original_id": f"m{i}"}},
            created_at=timezone.now(),
            failure_count=5,
            last_error=f"ValueError: bad order {i}",
            original_topic="orders",
            using="default",
        )
    sequence("orders_dlq")
    rows = reader(spark, queue_options, "orders_dlq").orderBy("id").collect()
    assert [r.id for r in rows] == ["billing:m0", "billing:m1", "billing:m2"]
    assert all(r.failure_count == 5 and r.original_topic == "orders" and r.failed_at is not None for r in rows)
    assert rows[1].last_error == "ValueError: bad order 1"
    assert '"consumer_group":"billing"' in rows[0].metadata


def test_read_several_topics_and_bad_options(spark, queue_options):
    publish_sequenced("a", 5)
    publish_sequenced("b", 7)
    assert reader(spark, queue_options, "a,b").count() == 12
    with pytest.raises(Exception, match="startingOffset 9 is after endingOffset 3"):
        reader(spark, queue_options, "a", startingOffset="9", endingOffset="3").collect()
    with pytest.raises(Exception, match="option 'topic' is required"):
        spark.read.format("sqlqueue").options(**queue_options).load().collect()


def _frame(spark, n, *, prefix="w"):
    rows = [(f"{prefix}{i}", f"customer-{i % 13}", (i, f"item {i}")) for i in range(n)]
    return spark.createDataFrame(rows, "id string, key string, payload struct<n: int, item: string>")


def test_write_twice_publishes_nothing_twice(spark, queue_options):
    df = _frame(spark, 500).repartition(3)
    for _ in range(2):
        df.write.format("sqlqueue").options(**queue_options).option("topic", "bulk").option("batchSize", "64").mode(
            "append"
        ).save()
    messages = stored("bulk")
    assert len(messages) == 500
    partitions = get_settings().partitions_for("bulk")
    for m in messages:
        i = int(m["id"][1:])
        assert m["payload"] == {"n": i, "item": f"item {i}"}
        # Hashed exactly as publish() hashes, and as Spark SQL's pmod(crc32(key), n).
        assert m["partition"] == partition_for(m["key"], partitions)
    spark_partitions = {
        r.key: r.p for r in df.selectExpr("key", f"pmod(crc32(key), {partitions}) AS p").distinct().collect()
    }
    assert all(spark_partitions[m["key"]] == m["partition"] for m in messages)


def test_write_json_string_payload_and_content_ids(spark, queue_options):
    rows = [("k1", '{"a": 1}'), ("k2", '{"a": 2}'), ("k1", '{"a": 1}')]
    df = spark.createDataFrame(rows, "key string, payload string")
    for _ in range(2):
        df.write.format("sqlqueue").options(**queue_options).option("topic", "json").option("idMode", "content").mode(
            "append"
        ).save()
    assert sorted(m["payload"]["a"] for m in stored("json")) == [1, 2]  # identical rows collapse
    with pytest.raises(Exception, match="has no column 'id'"):
        df.write.format("sqlqueue").options(**queue_options).option("topic", "json").mode("append").save()


def test_write_bad_json_fails_with_a_clear_error_and_writes_nothing(spark, queue_options):
    df = spark.createDataFrame([("1", '{"a": 1}'), ("2", "{not json")], "id string, payload string").coalesce(1)
    with pytest.raises(Exception) as info:
        df.write.format("sqlqueue").options(**queue_options).option("topic", "bad").mode("append").save()
    assert "InvalidMessage" in str(info.value)
    assert "row 1 of this task, id '2': the payload column is not valid JSON" in str(info.value)
    assert Message.objects.filter(topic="bad").count() == 0
    assert issubclass(InvalidMessage, Exception)


def test_write_validates_as_publish_does(spark, queue_options):
    """The writer runs publish()'s own checks: a 140-character topic is refused (the maximum
    is 128), and a bad row is named by its id and key as well as its position."""
    df = spark.createDataFrame([(str(i), "k", '{"a": 1}') for i in range(10)], "id string, key string, payload string")
    long_topic = "t" * 140
    with pytest.raises(Exception, match="topic is 140 characters long; the maximum is 128"):
        df.write.format("sqlqueue").options(**queue_options).option("topic", long_topic).mode("append").save()
    assert Message.objects.filter(topic=long_topic).count() == 0
    from django_sqlqueue.publisher import publish

    with pytest.raises(InvalidMessage, match="topic is 140 characters long; the maximum is 128"):
        publish(long_topic, {"a": 1})

    bad_key = spark.createDataFrame(
        [("ok", "k", '{"a": 1}'), ("order-17", " padded", '{"a": 2}')], "id string, key string, payload string"
    ).coalesce(1)
    with pytest.raises(Exception) as info:
        bad_key.write.format("sqlqueue").options(**queue_options).option("topic", "keys").mode("append").save()
    assert "row 1 of this task, id 'order-17', key ' padded': key ' padded' must not start or end with whitespace" in (
        str(info.value)
    )
    assert Message.objects.filter(topic="keys").count() == 0


def _pid_of_local_port(port: int) -> int | None:
    """The process owning the TCP socket bound to local ``port`` (Linux /proc)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inode = fields[9]
    if inode is None:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    return None


def test_killed_and_retried_task_publishes_each_message_once(spark, queue_options):
    """The writing task's Python worker is killed (SIGKILL) after it committed some
    batches; Spark retries the task (``local[2,2]``); the retry publishes the same ids
    again, which stores nothing twice.

    The test finds the writer by its database connection: the client port of the one
    other connection to the test database, mapped to its process through /proc.
    """
    if connection.vendor != "mysql":
        pytest.skip("finds the writer through MySQL's processlist")
    import MySQLdb

    total, batch = 20000, 50
    db = {k: queue_options[k] for k in ("host", "port", "user", "password", "database")}
    df = (
        spark.range(total)
        .coalesce(1)
        .selectExpr("CAST(id AS STRING) AS id", "named_struct('n', id, 'pad', repeat('x', 1000)) AS payload")
    )
    from pyspark import InheritableThread

    failures: list[BaseException] = []

    def write() -> None:
        # Spark finds Python data sources through the thread's active session (JVM side).
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            df.write.format("sqlqueue").options(**queue_options).option("topic", "retried").option(
                "batchSize", str(batch)
            ).mode("append").save()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failures.append(exc)

    # An InheritableThread carries the local properties into its JVM thread.
    job = InheritableThread(target=write, name="writer")
    job.start()
    monitor = MySQLdb.connect(
        host=db["host"],
        port=int(db["port"] or 3306),
        user=db["user"],
        passwd=db["password"],
        db=db["database"],
        autocommit=True,
    )
    killed = None
    try:
        cur = monitor.cursor()
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and job.is_alive():
            cur.execute("SELECT COUNT(*) FROM queue_messages WHERE topic = 'retried'")
            committed = cur.fetchone()[0]
            if committed >= batch:
                cur.execute(
                    "SELECT host FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID() "
                    "AND info LIKE %s",
                    [db["database"], "%queue_messages%"],
                )
                for (host,) in cur.fetchall():
                    pid = _pid_of_local_port(int(host.rsplit(":", 1)[1])) if ":" in host else None
                    if pid and pid != os.getpid():
                        os.kill(pid, signal.SIGKILL)
                        killed = (pid, committed)
                        break
            time.sleep(0.02)
    finally:
        monitor.close()
    job.join(180)
    assert not job.is_alive() and not failures, [str(f)[:3000] for f in failures]

    assert killed is not None, "the writing task was never killed"
    assert batch <= killed[1] < total
    ids = list(Message.objects.filter(topic="retried").values_list("id", flat=True))
    assert len(ids) == total
    assert sorted(int(i) for i in ids) == list(range(total))


def test_the_data_source_types_the_payload_and_refuses_to_overwrite_the_log() -> None:
    """source.py: the schema a read announces, and no write mode but append."""
    from django_sqlqueue.spark.options import SparkOptionError
    from django_sqlqueue.spark.schema import message_schema
    from django_sqlqueue.spark.source import SQLQueueDataSource

    assert SQLQueueDataSource.name() == "sqlqueue"
    assert SQLQueueDataSource({}).schema() == message_schema()
    typed = SQLQueueDataSource({"payloadschema": "struct<n:int>"}).schema()
    assert typed == message_schema("struct<n:int>", "_corrupt_record")  # PERMISSIVE by default: a column for misfits
    assert SQLQueueDataSource({"payloadschema": "struct<n:int>", "mode": "FAILFAST"}).schema() == message_schema(
        "struct<n:int>"
    )
    with pytest.raises(SparkOptionError, match="append-only"):
        SQLQueueDataSource({}).writer(None, overwrite=True)
    with pytest.raises(SparkOptionError, match="append-only"):
        SQLQueueDataSource({}).streamWriter(None, overwrite=True)
